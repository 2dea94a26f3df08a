-- The sessions holding a Run that was granted a slot more than a heartbeat ago and that no
-- incarnation has acquired: the activation hint was lost.
SELECT DISTINCT session_id FROM runs
WHERE status = 'running' AND owner IS NULL AND started_at < now() - make_interval(secs => %(seconds)s)
