-- Announce sandbox work (state creating or releasing) before doing it outside any transaction;
-- updated_at starts the clock after which another process may take the work over.
UPDATE sandbox_leases
SET state = %(state)s, backend = %(backend)s, handle = %(handle)s, updated_at = now()
WHERE tree_id = %(tree_id)s
