-- A scope's live roots newest first (the sidebar's list, every few seconds), of the scope or of one
-- project: the scope's roots index held archived roots too, and a project's index every member of
-- its trees, each read and filtered out. A project's index in the order its sessions are listed in
-- (the list_sessions tool's scope "project"), which sorted every session of the project for a page;
-- in creation order, a planner could take it for the project's roots too and read them all.
CREATE INDEX sessions_scope_live_roots ON sessions (user_id, app_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND NOT archived;
CREATE INDEX sessions_project_live_roots ON sessions (project_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND NOT archived;
DROP INDEX sessions_project;
CREATE INDEX sessions_project ON sessions (project_id, tree_id, path);
-- A project's roots with the archived ones (asked for), which the creation-order index served.
CREATE INDEX sessions_project_roots ON sessions (project_id, created_at DESC, session_id DESC) WHERE parent_id IS NULL;
