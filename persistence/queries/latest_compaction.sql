-- A session's latest compaction summary, as the history reads it.
SELECT id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at
FROM thread_messages
WHERE session_id = %(session_id)s AND origin->>'kind' = 'compaction'
ORDER BY id DESC LIMIT 1
