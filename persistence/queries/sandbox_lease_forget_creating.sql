-- A failed first claim leaves no row behind, as if it never happened.
DELETE FROM sandbox_leases
WHERE tree_id = %(tree_id)s AND state = 'creating' AND handle IS NULL
