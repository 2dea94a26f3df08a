-- Metrics without table scans: counters of things that happen get a table of their own, and the
-- state gauges that had no partial index get one. The totals of trees and sessions start from
-- what the database already holds (a scan, once, here); every other counter starts at zero.
CREATE INDEX trees_stopped ON trees (tree_id) WHERE stopped;
CREATE INDEX open_streams_expiry ON open_streams (expires_at);

CREATE TABLE metric_counters (
    name    text NOT NULL,
    labels  jsonb NOT NULL DEFAULT '{}',
    value   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, labels)
);
INSERT INTO metric_counters (name, labels, value)
SELECT 'canopy_trees_created', '{}'::jsonb, count(*) FROM trees
UNION ALL SELECT 'canopy_sessions_created', '{}'::jsonb, count(*) FROM sessions;
