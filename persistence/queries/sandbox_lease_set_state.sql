UPDATE sandbox_leases
SET state = %(state)s, handle = %(handle)s, updated_at = now()
WHERE tree_id = %(tree_id)s
