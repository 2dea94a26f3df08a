-- The inputs a schedule gave, latest first: how many of them still wait is read at each firing.
CREATE INDEX schedule_firings_inputs ON schedule_firings (schedule_id, due_at DESC) WHERE input_id IS NOT NULL;
