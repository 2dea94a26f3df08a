-- Releases whose releaser died (releasing for longer than the bound): the sweep finishes them.
SELECT tree_id
FROM sandbox_leases
WHERE state = 'releasing'
  AND updated_at < now() - make_interval(secs => %(stale_seconds)s)
  AND (%(node_id)s::text IS NULL OR node_id IS NULL OR node_id = %(node_id)s)
ORDER BY updated_at
LIMIT %(limit)s
