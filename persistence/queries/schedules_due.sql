-- Schedules whose next due time has come.
SELECT schedule_id FROM schedules
WHERE deleted_at IS NULL AND next_due_at <= now()
ORDER BY next_due_at LIMIT %(limit)s
