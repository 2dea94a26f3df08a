-- Claims and releases of one tree serialise on this row lock.
SELECT tree_id, backend, handle, state, last_used_at, updated_at
FROM sandbox_leases
WHERE tree_id = %(tree_id)s
FOR UPDATE
