-- The lease row, locked, only if it is still active and idle. SKIP LOCKED: a tree whose row
-- is locked is being claimed right now, so it is not idle; the next sweep looks again.
SELECT tree_id, backend, handle, state, last_used_at, updated_at, node_id, workdir_lost_at, false AS stale
FROM sandbox_leases
WHERE tree_id = %(tree_id)s
  AND state = 'active'
  AND last_used_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(idle_seconds)s)
FOR UPDATE SKIP LOCKED
