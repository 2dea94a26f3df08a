-- A scope's live roots newest first (the sidebar's list, every few seconds), of the scope or of one
-- project: the scope's roots index held archived roots too, and a project's index every member of
-- its trees, each read and filtered out.
CREATE INDEX sessions_scope_live_roots ON sessions (user_id, app_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND NOT archived;
CREATE INDEX sessions_project_live_roots ON sessions (project_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND NOT archived;
