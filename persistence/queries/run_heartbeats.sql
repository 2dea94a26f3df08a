-- Renew the leases of the Runs one process executes, in one statement, and name those it still
-- holds, with their Turns' status: a Run whose lease lapsed, or that another incarnation took, is
-- not named (it must stop). A Run whose row is locked (its own commit under way, or a stop) is
-- named but not renewed until the next beat: waiting for it would hold up every other renewal.
-- (A data-modifying WITH runs to completion whether or not the outer query reads it.)
WITH asked AS (
    SELECT * FROM unnest(%(run_ids)s::uuid[], %(owners)s::text[]) AS a(run_id, owner)
), held AS (
    SELECT r.run_id FROM runs r JOIN asked a ON a.run_id = r.run_id AND a.owner = r.owner
    WHERE r.status = 'running' AND r.lease_expires_at > now()
    FOR NO KEY UPDATE OF r SKIP LOCKED
), renewed AS (
    UPDATE runs r SET lease_expires_at = now() + make_interval(secs => %(lease)s)
    FROM held WHERE r.run_id = held.run_id
)
SELECT r.run_id, t.status AS turn_status
FROM asked a
JOIN runs r ON r.run_id = a.run_id AND r.owner = a.owner AND r.status = 'running' AND r.lease_expires_at > now()
JOIN turns t ON t.turn_id = r.turn_id
