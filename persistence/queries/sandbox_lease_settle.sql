-- Compare-and-set after the sandbox work: only if the lease is still in the state (and names the
-- handle) the work started from. A process whose work was taken over settles nothing.
UPDATE sandbox_leases
SET state = %(state)s,
    handle = %(handle)s,
    updated_at = now(),
    last_used_at = CASE WHEN %(state)s = 'active' THEN now() ELSE last_used_at END
WHERE tree_id = %(tree_id)s
  AND state = %(from_state)s
  AND handle IS NOT DISTINCT FROM %(from_handle)s
RETURNING tree_id
