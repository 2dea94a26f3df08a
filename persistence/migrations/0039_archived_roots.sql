-- A scope's or a project's roots with the archived ones (asked for) are two ranges in the order they
-- are listed, the live roots' and the archived roots', merged: an index of every root in that order
-- served a planner as well as the live roots' own, and one that took few roots to be archived (its
-- statistics older than an archive) read every archived root of a project for a page of live ones.
CREATE INDEX sessions_scope_archived_roots ON sessions (user_id, app_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND archived;
CREATE INDEX sessions_project_archived_roots ON sessions (project_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND archived;
DROP INDEX sessions_scope_roots;
DROP INDEX sessions_project_roots;
