-- The session was told of its tree's latest workdir loss (in the commit of the result that told it).
INSERT INTO workdir_losses_told (session_id, lost_at)
SELECT %(session_id)s, workdir_lost_at FROM sandbox_leases
WHERE tree_id = %(tree_id)s AND workdir_lost_at IS NOT NULL
ON CONFLICT DO NOTHING
