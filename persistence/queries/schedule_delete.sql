-- A schedule stops (its firings stay on record).
UPDATE schedules SET deleted_at = now()
WHERE schedule_id = %(schedule_id)s AND session_id = %(session_id)s AND user_id = %(user_id)s
  AND app_id = %(app_id)s AND deleted_at IS NULL
RETURNING schedule_id
