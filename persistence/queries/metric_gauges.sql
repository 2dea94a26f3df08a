-- The state gauges of /metrics and of the sweeper's Ray gauges. Each count reads one partial index
-- (named beside it): the rows in that state now, never a whole table.
SELECT
    (SELECT count(*) FROM runs WHERE status = 'running') AS slots_in_use,             -- runs_tree_running
    (SELECT count(*) FROM runs WHERE status = 'pending') AS runs_queued,              -- runs_tree_pending
    (SELECT count(*) FROM inputs WHERE status = 'pending') AS inputs_pending,         -- inputs_pending
    (SELECT count(*) FROM requests WHERE status = 'pending') AS requests_pending,     -- requests_tree_pending
    (SELECT count(*) FROM trees WHERE stopped) AS trees_stopped,                      -- trees_stopped
    (SELECT count(*) FROM (SELECT tree_id FROM runs WHERE status = 'running'
                           UNION SELECT tree_id FROM runs WHERE status = 'pending') AS busy) AS trees_busy,
    (SELECT count(*) FROM open_streams WHERE expires_at > now()) AS event_streams_open, -- open_streams_expiry
    (SELECT coalesce(jsonb_agg(jsonb_build_object('status', status, 'waiting_for', waiting_for, 'n', n)), '[]')
     FROM (SELECT status, coalesce(waiting_for, '') AS waiting_for, count(*) AS n
           FROM turns WHERE status IN ('running', 'waiting', 'cancelling')              -- turns_one_open_per_session
           GROUP BY 1, 2) AS open_turns) AS turns
