-- A human asks for a session's history to be compacted at its next model call.
UPDATE sessions SET compact_requested = true
WHERE session_id = %(session_id)s AND user_id = %(user_id)s AND app_id = %(app_id)s
RETURNING session_id
