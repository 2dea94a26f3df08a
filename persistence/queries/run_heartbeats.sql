-- Renew the leases of the Runs one process executes, in one statement, and name those it still
-- holds, with their Turns' status: a Run whose lease lapsed, or that another incarnation took, is
-- not named (it must stop). A Run whose row another transaction has locked (its own commit under
-- way, a stop, a recovery) is named but not renewed here (renewed = false): waiting for it would
-- hold up every other renewal, and stopping it would cut its commit off. run_heartbeats_busy then
-- waits for it, briefly; past that it is judged at a later beat.
-- (A data-modifying WITH runs to completion whether or not the outer query reads it.)
WITH asked AS (
    SELECT * FROM unnest(%(run_ids)s::uuid[], %(owners)s::text[]) AS a(run_id, owner)
), lockable AS (
    SELECT r.run_id, r.lease_expires_at > now() AS live
    FROM runs r JOIN asked a ON a.run_id = r.run_id AND a.owner = r.owner
    WHERE r.status = 'running'
    FOR NO KEY UPDATE OF r SKIP LOCKED
), renewed AS (
    UPDATE runs r SET lease_expires_at = now() + make_interval(secs => %(lease)s)
    FROM lockable l WHERE r.run_id = l.run_id AND l.live
)
SELECT r.run_id, t.status AS turn_status, l.run_id IS NOT NULL AS renewed
FROM asked a
JOIN runs r ON r.run_id = a.run_id AND r.owner = a.owner AND r.status = 'running'
JOIN turns t ON t.turn_id = r.turn_id
LEFT JOIN lockable l ON l.run_id = r.run_id
WHERE l.live OR l.run_id IS NULL
