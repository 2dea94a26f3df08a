-- Candidates for the idle sweep; each one is re-checked under its row lock before release.
SELECT tree_id
FROM sandbox_leases
WHERE state = 'active'
  AND last_used_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(idle_seconds)s)
  AND (%(node_id)s::text IS NULL OR node_id IS NULL OR node_id = %(node_id)s)
ORDER BY last_used_at
LIMIT %(limit)s
