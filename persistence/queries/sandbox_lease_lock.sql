-- Claims and releases of one tree serialise on this row lock, held only for the decision:
-- the sandbox work itself happens after the commit, announced by state creating/releasing.
SELECT tree_id, backend, handle, state, last_used_at, updated_at, node_id, workdir_lost_at,
       updated_at < now() - make_interval(secs => %(stale_seconds)s) AS stale
FROM sandbox_leases
WHERE tree_id = %(tree_id)s
FOR UPDATE
