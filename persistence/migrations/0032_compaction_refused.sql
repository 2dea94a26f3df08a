-- A summary that failed or could not be used is remembered, so later Runs do not ask (and pay) again.
ALTER TABLE sessions ADD COLUMN compaction_refused_until bigint;
