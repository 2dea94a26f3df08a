UPDATE sandbox_leases
SET backend = %(backend)s, handle = %(handle)s, state = 'active', last_used_at = now(), updated_at = now()
WHERE tree_id = %(tree_id)s
