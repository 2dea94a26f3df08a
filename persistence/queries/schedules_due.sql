-- Schedules whose next due time has come, but not one catching up on every missed due time that
-- has %(window)s inputs waiting: it holds its due time, and leaves the head of the list to the others.
SELECT s.schedule_id FROM schedules s
WHERE s.deleted_at IS NULL AND s.next_due_at <= now()
  AND NOT (s.catch_up = 'all' AND canopy_schedule_inputs_waiting(s.schedule_id, %(window)s) >= %(window)s)
ORDER BY s.next_due_at LIMIT %(limit)s
