-- A session's inputs in queue order, whatever their state: the pages of its input list (which read
-- every input of the database without it).
CREATE INDEX inputs_session ON inputs (session_id, seq);
