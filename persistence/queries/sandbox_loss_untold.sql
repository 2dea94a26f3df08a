-- The tree's workdir was lost after the session was made, and no committed result told it yet.
SELECT l.workdir_lost_at
FROM sandbox_leases l JOIN sessions s ON s.session_id = %(session_id)s AND s.tree_id = l.tree_id
WHERE l.tree_id = %(tree_id)s AND l.workdir_lost_at > s.created_at
  AND NOT EXISTS (SELECT 1 FROM workdir_losses_told t WHERE t.session_id = s.session_id AND t.lost_at = l.workdir_lost_at)
