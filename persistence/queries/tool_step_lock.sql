-- A tool step begins: whether the Run still holds its lease (its row locked, as runs.fence locks
-- it), and its session's row locked. A cancel or a stop of the Turn locks that row first, so one
-- that committed before this statement is seen by the next one (a statement of its own: this
-- statement's snapshot predates any wait for the lock), and one that comes later waits for this
-- step's commit: no tool call of a cancelled Turn runs.
WITH fence AS (
    SELECT run_id FROM runs
    WHERE run_id = %(run_id)s AND owner = %(owner)s AND status = 'running' AND lease_expires_at > now()
    FOR NO KEY UPDATE
), session AS (
    SELECT session_id FROM sessions WHERE session_id = %(session_id)s FOR NO KEY UPDATE
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced, EXISTS (SELECT 1 FROM session) AS locked
