-- How many inputs models gave one another before the one that started this Turn (0: a human's,
-- a schedule's, the API's). Canopy alone writes an input's origin.
SELECT coalesce((i.origin ->> 'hops')::int, 0) AS hops
FROM turns t JOIN inputs i ON i.input_id = t.input_id
WHERE t.turn_id = %(turn_id)s
