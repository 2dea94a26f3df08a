-- A due schedule, locked for firing, with how many of its latest inputs (up to %(window)s) still wait
-- in its session's queue (taken in FIFO, the waiting ones are its latest); nothing if it is not due
-- (any more) or another sweeper fires it.
SELECT s.schedule_id, s.user_id, s.app_id, s.session_id, s.cron, s.interval_seconds, s.input_text, s.catch_up,
       s.next_due_at, now() AS now, ss.tree_id,
       (SELECT count(*) FROM (SELECT f.input_id FROM schedule_firings f
                              WHERE f.schedule_id = s.schedule_id AND f.input_id IS NOT NULL
                              ORDER BY f.due_at DESC LIMIT %(window)s) latest
        JOIN inputs i ON i.input_id = latest.input_id WHERE i.status = 'pending') AS inputs_waiting
FROM schedules s JOIN sessions ss ON ss.session_id = s.session_id
WHERE s.schedule_id = %(schedule_id)s AND s.deleted_at IS NULL AND s.next_due_at <= now()
FOR UPDATE OF s SKIP LOCKED
