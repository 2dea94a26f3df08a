-- A new schedule.
INSERT INTO schedules (schedule_id, user_id, app_id, session_id, cron, interval_seconds, input_text, catch_up,
                       next_due_at)
VALUES (%(schedule_id)s, %(user_id)s, %(app_id)s, %(session_id)s, %(cron)s, %(interval_seconds)s, %(input_text)s,
        %(catch_up)s, %(next_due_at)s)
RETURNING schedule_id, session_id, cron, interval_seconds, input_text, catch_up, next_due_at, created_at
