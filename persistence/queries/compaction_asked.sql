-- A summary was asked for: a human's request this Run read is served (%(served)s: one that came
-- while the summary was being made stays), and one that failed or could not be used is remembered
-- by the last message it was to stand for (NULL: a summary was committed).
UPDATE sessions SET compact_requested = compact_requested AND NOT %(served)s,
                    compaction_refused_until = %(refused_until)s
WHERE session_id = %(session_id)s
