-- A schedule whose rule has no further due time ends, as a delete ends it (its firings stay on record).
UPDATE schedules SET deleted_at = now() WHERE schedule_id = %(schedule_id)s
