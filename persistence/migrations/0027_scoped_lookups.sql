-- Lookups that read every tenant's rows (or a table's whole history) where they want a few.
-- A scope's sessions, every tree's (the list_sessions tool's scope "all").
CREATE INDEX sessions_scope ON sessions (user_id, app_id, created_at DESC);
-- A session's running Runs, among them the one no incarnation has taken yet (every activation, drain
-- and sweep asks). Not on owner: every acquisition would then write every index of the row.
CREATE INDEX runs_session_running ON runs (session_id) WHERE status = 'running';
-- A tree's stops and continues (its timeline), not its whole history.
CREATE INDEX events_tree_stops ON events (tree_id, cursor) WHERE kind IN ('tree_stopped', 'tree_continued');
-- The sweeps' releases and lost nodes: the leases not released.
CREATE INDEX sandbox_leases_unreleased ON sandbox_leases (state) WHERE state <> 'released';
