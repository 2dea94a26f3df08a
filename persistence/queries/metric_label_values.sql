-- The values one label of a counter already has (its rows are found by the primary key's prefix).
SELECT DISTINCT labels ->> %(label)s AS value FROM metric_counters
WHERE name = %(name)s AND labels ? %(label)s
