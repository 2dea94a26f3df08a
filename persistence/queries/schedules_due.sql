-- Schedules whose next due time has come, but not one catching up on every missed due time that
-- has %(window)s inputs waiting, or whose session's queue is full (%(queue_limit)s inputs waiting, by
-- the partial index inputs_pending): it holds its due time, and leaves the head of the list to the
-- others.
-- Each scope in turn (its oldest due first, then every scope's second, ...): a scope with many
-- schedules due does not fill the sweep's batch ahead of another scope's one.
SELECT schedule_id FROM (
    SELECT s.schedule_id, s.next_due_at,
           row_number() OVER (PARTITION BY s.user_id, s.app_id ORDER BY s.next_due_at) AS place
    FROM schedules s
    WHERE s.deleted_at IS NULL AND s.next_due_at <= now()
      AND NOT (s.catch_up = 'all' AND (canopy_schedule_inputs_waiting(s.schedule_id, %(window)s) >= %(window)s
                                       OR (SELECT count(*) FROM (SELECT 1 FROM inputs i
                                                                 WHERE i.session_id = s.session_id
                                                                   AND i.status = 'pending'
                                                                 LIMIT %(queue_limit)s) waiting) >= %(queue_limit)s))
) due
ORDER BY place, next_due_at LIMIT %(limit)s
