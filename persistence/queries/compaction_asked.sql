-- A summary was asked for: a human's request is served, and one that failed or could not be used is
-- remembered by the last message it was to stand for (NULL: a summary was committed).
UPDATE sessions SET compact_requested = false, compaction_refused_until = %(refused_until)s
WHERE session_id = %(session_id)s
