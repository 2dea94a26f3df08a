-- How many sessions a tree has.
SELECT count(*) AS n FROM sessions WHERE tree_id = %(tree_id)s
