-- The beat's second statement, for the Runs whose rows were locked at its first (run_heartbeats):
-- a Run mid-commit holds its row for milliseconds, and one that commits step after step holds it
-- most of the time, so a beat that only skipped it let its lease run out. This one waits for the
-- rows (in one order), bounded by the caller's lock_timeout: a commit stuck longer is judged later.
UPDATE runs r SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM (
    SELECT r2.run_id FROM runs r2
    JOIN unnest(%(run_ids)s::uuid[], %(owners)s::text[]) AS a(run_id, owner)
      ON a.run_id = r2.run_id AND a.owner = r2.owner
    WHERE r2.status = 'running' AND r2.lease_expires_at > now()
    ORDER BY r2.run_id
    FOR NO KEY UPDATE OF r2
) busy
WHERE r.run_id = busy.run_id
