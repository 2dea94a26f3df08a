-- A model reply (or a compaction summary) joins the history with its call's usage counted on the
-- Run, fenced in the same statement: nothing is written unless this incarnation still holds the
-- Run's lease (the Run row stays locked, as runs.fence leaves it).
WITH charged AS (
    UPDATE runs SET prompt_tokens = prompt_tokens + %(prompt_tokens)s,
                    completion_tokens = completion_tokens + %(completion_tokens)s,
                    cost_usd = cost_usd + %(cost_usd)s
    WHERE run_id = %(run_id)s AND owner = %(owner)s AND status = 'running' AND lease_expires_at > now()
    RETURNING run_id
)
INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, tool_calls, origin)
SELECT %(session_id)s, %(turn_id)s, run_id, %(role)s, %(content)s, %(tool_calls)s, %(origin)s FROM charged
RETURNING id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at
