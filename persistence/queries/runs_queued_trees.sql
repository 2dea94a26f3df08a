-- The trees with a queued (pending) Run: each may have a slot to grant.
SELECT DISTINCT tree_id FROM runs WHERE status = 'pending'
