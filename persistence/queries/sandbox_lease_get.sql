SELECT tree_id, backend, handle, state, last_used_at, updated_at, node_id, workdir_lost_at,
       updated_at < now() - make_interval(secs => %(stale_seconds)s) AS stale
FROM sandbox_leases
WHERE tree_id = %(tree_id)s
