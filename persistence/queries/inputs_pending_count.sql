-- How many inputs wait in a session's queue, up to the limit (the partial index inputs_pending).
SELECT count(*) AS pending
FROM (SELECT 1 FROM inputs WHERE session_id = %(session_id)s AND status = 'pending' LIMIT %(limit)s) waiting
