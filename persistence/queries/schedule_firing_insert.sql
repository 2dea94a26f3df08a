-- A due time fired: the key (schedule, due time) makes it once.
INSERT INTO schedule_firings (schedule_id, due_at, input_id, error)
VALUES (%(schedule_id)s, %(due_at)s, %(input_id)s, %(error)s)
