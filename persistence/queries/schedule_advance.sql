-- A schedule's next due time.
UPDATE schedules SET next_due_at = %(next_due_at)s WHERE schedule_id = %(schedule_id)s
