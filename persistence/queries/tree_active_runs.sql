-- Whether any Run of a tree is queued or holds a slot: a probe of each status's partial index. A
-- status IN list proves neither, so it read every Run the tree ever had (the supervisor asks every
-- CANOPY_SWEEP_SECONDS while its tree is live).
SELECT EXISTS (SELECT 1 FROM runs WHERE tree_id = %(tree_id)s AND status = 'running')
    OR EXISTS (SELECT 1 FROM runs WHERE tree_id = %(tree_id)s AND status = 'pending') AS active
