-- A session's schedules (not deleted), with when each last fired.
SELECT s.schedule_id, s.session_id, s.cron, s.interval_seconds, s.input_text, s.catch_up, s.next_due_at,
       s.created_at, (SELECT max(f.due_at) FROM schedule_firings f WHERE f.schedule_id = s.schedule_id)
           AS last_due_at
FROM schedules s
WHERE s.session_id = %(session_id)s AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s
  AND s.deleted_at IS NULL
ORDER BY s.created_at
