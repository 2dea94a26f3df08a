-- A due schedule, locked for firing, with how many of its latest inputs (up to %(window)s) still wait
-- in its session's queue; nothing if it is not due (any more) or another sweeper fires it.
SELECT s.schedule_id, s.user_id, s.app_id, s.session_id, s.cron, s.interval_seconds, s.input_text, s.catch_up,
       s.next_due_at, now() AS now, ss.tree_id, ss.archived,
       canopy_schedule_inputs_waiting(s.schedule_id, %(window)s) AS inputs_waiting
FROM schedules s JOIN sessions ss ON ss.session_id = s.session_id
WHERE s.schedule_id = %(schedule_id)s AND s.deleted_at IS NULL AND s.next_due_at <= now()
FOR UPDATE OF s SKIP LOCKED
