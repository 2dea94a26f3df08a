-- The history was compacted: the request is served.
UPDATE sessions SET compact_requested = false WHERE session_id = %(session_id)s AND compact_requested
