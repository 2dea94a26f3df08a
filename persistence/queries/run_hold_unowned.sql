-- The session's granted Runs nobody owns, held at least ``wait`` seconds more: its host drains
-- (actors/hosting.py) and makes no session meanwhile, and the sweep would take a Run whose lease ran
-- out during the drain for one whose owner died, counting it towards its Turn's recoveries.
UPDATE runs SET lease_expires_at = greatest(lease_expires_at, now() + make_interval(secs => %(wait)s))
WHERE session_id = %(session_id)s AND status = 'running' AND owner IS NULL
