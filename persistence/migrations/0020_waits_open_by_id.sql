-- The open waits in id order: the sweep's page of them (waits_to_sweep.sql), past the closed ones.
CREATE INDEX waits_open_id ON waits (wait_id) WHERE status = 'open';
