-- Candidates for the idle sweep, least recently used first; each one is re-checked under its row
-- lock before release. A tree with a running Run is in use: left out, or a page of busy trees would
-- hide the idle ones behind it. Another scope's are left out per lease (it scales with the leases held,
-- not with the scope's trees).
SELECT tree_id, node_id
FROM sandbox_leases
WHERE state = 'active'
  AND last_used_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(idle_seconds)s)
  AND (%(node_id)s::text IS NULL OR node_id IS NULL OR node_id = %(node_id)s)
  AND (%(scope_of)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM trees o JOIN trees t ON t.user_id = o.user_id AND t.app_id = o.app_id
        WHERE o.tree_id = sandbox_leases.tree_id AND t.tree_id = %(scope_of)s))
  AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.tree_id = sandbox_leases.tree_id AND runs.status = 'running')
ORDER BY last_used_at
LIMIT %(limit)s
