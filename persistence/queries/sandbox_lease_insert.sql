-- Make sure the tree has a lease row to lock; a new row starts released (no sandbox yet).
-- Returns a row only when it inserted one.
INSERT INTO sandbox_leases (tree_id, backend, state)
VALUES (%(tree_id)s, %(backend)s, 'released')
ON CONFLICT (tree_id) DO NOTHING
RETURNING tree_id
