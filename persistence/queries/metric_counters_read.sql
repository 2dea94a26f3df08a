-- Every counter row: one per metric and label set, a bounded table (label values are bounded).
SELECT name, labels, value FROM metric_counters ORDER BY name, labels
