-- A human asks for a session's history to be compacted at its next model call. An archived
-- session makes none: it is read back as archived and left as it is.
WITH target AS (
    SELECT session_id, archived FROM sessions
    WHERE session_id = %(session_id)s AND user_id = %(user_id)s AND app_id = %(app_id)s
    FOR UPDATE
), asked AS (
    UPDATE sessions s SET compact_requested = true
    FROM target WHERE s.session_id = target.session_id AND NOT target.archived
)
SELECT session_id, archived FROM target
