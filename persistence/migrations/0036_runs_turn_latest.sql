-- A Turn's latest Run (every session's state as lists and tree summaries show it, a cancel) was
-- found by reading and sorting all the Turn's Runs: a Turn that parks and resumes has one per wait.
DROP INDEX runs_turn;
CREATE INDEX runs_turn ON runs (turn_id, queued_at DESC);
