-- Whom a change to these sessions concerns: their trees (a slot may be free, an input queued)
-- and the open waits watching any of them (their waiters may now be due).
SELECT ARRAY(SELECT DISTINCT tree_id FROM sessions WHERE session_id = ANY(%(ids)s)) AS tree_ids,
       ARRAY(SELECT DISTINCT w.wait_id FROM wait_targets t JOIN waits w ON w.wait_id = t.wait_id
             WHERE t.session_id = ANY(%(ids)s) AND w.status = 'open') AS wait_ids
