-- Schedules whose next due time has come, but not one catching up on every missed due time that
-- has %(window)s inputs waiting: it holds its due time, and leaves the head of the list to the others.
SELECT s.schedule_id FROM schedules s
WHERE s.deleted_at IS NULL AND s.next_due_at <= now()
  AND NOT (s.catch_up = 'all'
           AND (SELECT count(*) FROM (SELECT f.input_id FROM schedule_firings f
                                      WHERE f.schedule_id = s.schedule_id AND f.input_id IS NOT NULL
                                      ORDER BY f.due_at DESC LIMIT %(window)s) latest
                JOIN inputs i ON i.input_id = latest.input_id WHERE i.status = 'pending') >= %(window)s)
ORDER BY s.next_due_at LIMIT %(limit)s
