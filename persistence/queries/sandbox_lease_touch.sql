UPDATE sandbox_leases
SET last_used_at = now()
WHERE tree_id = %(tree_id)s AND state = 'active'
RETURNING tree_id
