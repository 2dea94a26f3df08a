-- The scope's index of sessions (0027) served the list of a scope's sessions, but given a session's
-- key and its scope a planner without fresh statistics (a new database, a burst of sessions before
-- autovacuum's analyze) took it for the lookup of one session and read all of the scope's: every
-- session lookup, and the deadlock check's walk once per wait. Partial indexes, live and archived
-- apart, serve the list (sessions.list_scope_sessions) and no lookup by key can use them.
DROP INDEX sessions_scope;
CREATE INDEX sessions_scope_live ON sessions (user_id, app_id, created_at DESC) WHERE NOT archived;
CREATE INDEX sessions_scope_archived ON sessions (user_id, app_id, created_at DESC) WHERE archived;
