-- Whom a change to these sessions concerns: their trees (a slot may be free, an input queued)
-- and the open waits watching any of them (their waiters may now be due). A target row is open
-- while its wait is (closed in the statements that close the wait): the waits are one range of
-- wait_targets_open, not every wait that ever watched the sessions, each checked open by its key
-- (a scalar subquery: a join could read every open wait of the database instead).
SELECT ARRAY(SELECT DISTINCT tree_id FROM sessions WHERE session_id = ANY(%(ids)s)) AS tree_ids,
       ARRAY(SELECT DISTINCT t.wait_id FROM wait_targets t
             WHERE t.session_id = ANY(%(ids)s) AND t.open
               AND (SELECT w.status FROM waits w WHERE w.wait_id = t.wait_id) = 'open') AS wait_ids
