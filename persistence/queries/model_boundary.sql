-- What a Run reads at a model boundary, in one round trip: whether it still holds its lease
-- (the Run row is locked if so, as runs.fence locks it), its Turn's status, whether the
-- tree's live text is watched, whether a human asked to compact the history and up to which
-- message a summary was refused (sessions.compaction_refused_until), the first budget
-- limit its tree's work has reached (then no model call starts: the tree is stopped), and the
-- unprocessed messages and steers (locked) to take in.
WITH fence AS (
    SELECT run_id FROM runs
    WHERE run_id = %(run_id)s AND owner = %(owner)s AND status = 'running' AND lease_expires_at > now()
    FOR NO KEY UPDATE
), unprocessed AS (
    SELECT c.message_id, c.kind, c.body, c.sender_session_id, c.received_at, s.path AS sender_path,
           s.tree_id AS sender_tree_id, st.approval_mode AS sender_approval_mode
    FROM coop_messages c
    LEFT JOIN sessions s ON s.session_id = c.sender_session_id
    LEFT JOIN turns st ON st.turn_id = c.source_turn_id
    WHERE c.receiver_session_id = %(session_id)s AND c.processed_at IS NULL
    FOR UPDATE OF c
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced,
       t.status AS turn_status,
       s.compact_requested, s.compaction_refused_until,
       EXISTS (SELECT 1 FROM stream_watchers w WHERE w.tree_id = %(tree_id)s AND w.watched_until > now()) AS watched,
       (SELECT canopy_budget_reached(%(tree_id)s)) AS budget_reached,
       m.message_id, m.kind, m.body, m.sender_session_id, m.sender_path, m.sender_tree_id, m.sender_approval_mode
FROM turns t JOIN sessions s ON s.session_id = t.session_id LEFT JOIN unprocessed m ON true
WHERE t.turn_id = %(turn_id)s
ORDER BY m.received_at, m.message_id
