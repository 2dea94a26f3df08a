-- For the rest of the scrape's transaction: counts are answered by the partial indexes over the few
-- rows in each state, never by a scan of a whole table (which the planner would pick for a small
-- table, or for a large one whose statistics are stale after a burst).
SELECT set_config('enable_seqscan', 'off', true)
