-- A process's gathered counts, added to their rows in one statement (one row per metric and label
-- set; the rows arrive sorted, so concurrent flushes lock shared rows in one order).
INSERT INTO metric_counters (name, labels, value)
SELECT name, labels, amount
FROM unnest(%(names)s::text[], %(labels)s::jsonb[], %(amounts)s::float8[]) AS c(name, labels, amount)
ON CONFLICT (name, labels) DO UPDATE SET value = metric_counters.value + EXCLUDED.value
