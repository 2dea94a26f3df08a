-- How many Runs of a tree are queued or hold a slot.
SELECT count(*) AS n FROM runs WHERE tree_id = %(tree_id)s AND status IN ('pending', 'running')
