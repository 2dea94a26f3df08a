-- Announce sandbox work (state creating or releasing) before doing it outside any transaction;
-- updated_at starts the clock after which another process may take the work over. A creation
-- names the node it builds on; a release leaves the node the sandbox is on.
UPDATE sandbox_leases
SET state = %(state)s, backend = %(backend)s, handle = %(handle)s, updated_at = now(),
    node_id = CASE WHEN %(state)s = 'creating' THEN %(node_id)s::text ELSE node_id END
WHERE tree_id = %(tree_id)s
