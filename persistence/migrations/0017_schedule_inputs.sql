-- The inputs a schedule gave, latest first: how many of them still wait is read at each firing.
CREATE INDEX schedule_firings_inputs ON schedule_firings (schedule_id, due_at DESC) WHERE input_id IS NOT NULL;
-- How many of a schedule's latest inputs (up to up_to) still wait in its session's queue. Inputs
-- are taken in FIFO, so a schedule's waiting inputs are its latest (persistence/schedules.py).
CREATE FUNCTION canopy_schedule_inputs_waiting(of_schedule uuid, up_to int) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*)
    FROM (SELECT f.input_id FROM schedule_firings f
          WHERE f.schedule_id = of_schedule AND f.input_id IS NOT NULL
          ORDER BY f.due_at DESC LIMIT up_to) latest
    JOIN inputs i ON i.input_id = latest.input_id
    WHERE i.status = 'pending'
$$;
