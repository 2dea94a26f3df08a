-- A model reply (or a compaction summary) joins the history with its call's usage counted on the
-- Run, its session and its tree, fenced in the same statement: nothing is written unless this incarnation
-- still holds the Run's lease (the Run row stays locked, as runs.fence leaves it). The tree's usage
-- row is the sum of its Runs' charges because only this statement charges either; it is locked
-- until the commit, so the concurrent Runs of one tree (at most its slots) commit their replies one
-- after another. With %(record)s false the call is charged and nothing joins the history (a
-- summary that is not used: billed all the same). %(unpriced)s is 1 for a call litellm has no price
-- for (%(cost_usd)s is 0 then): the Run, the session and the tree count it. No row: the lease is gone.
WITH charged AS (
    UPDATE runs SET prompt_tokens = prompt_tokens + %(prompt_tokens)s,
                    completion_tokens = completion_tokens + %(completion_tokens)s,
                    cost_usd = cost_usd + %(cost_usd)s,
                    model_calls = model_calls + 1,
                    unpriced_calls = unpriced_calls + %(unpriced)s
    WHERE run_id = %(run_id)s AND owner = %(owner)s AND status = 'running' AND lease_expires_at > now()
    RETURNING run_id, tree_id, session_id
), tree_charged AS (
    UPDATE tree_usage u SET prompt_tokens = u.prompt_tokens + %(prompt_tokens)s,
                            completion_tokens = u.completion_tokens + %(completion_tokens)s,
                            cost_usd = u.cost_usd + %(cost_usd)s,
                            model_calls = u.model_calls + 1,
                            unpriced_calls = u.unpriced_calls + %(unpriced)s
    FROM charged WHERE u.tree_id = charged.tree_id
), session_charged AS (
    INSERT INTO session_usage AS u (tree_id, session_id, prompt_tokens, completion_tokens, cost_usd, model_calls,
                                    unpriced_calls)
    SELECT tree_id, session_id, %(prompt_tokens)s::bigint, %(completion_tokens)s::bigint, %(cost_usd)s::float8, 1,
           %(unpriced)s::bigint
    FROM charged
    ON CONFLICT (tree_id, session_id) DO UPDATE SET prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
                                                    completion_tokens = u.completion_tokens + excluded.completion_tokens,
                                                    cost_usd = u.cost_usd + excluded.cost_usd,
                                                    model_calls = u.model_calls + 1,
                                                    unpriced_calls = u.unpriced_calls + excluded.unpriced_calls
), recorded AS (
    INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, tool_calls, origin)
    SELECT %(session_id)s, %(turn_id)s, run_id, %(role)s, %(content)s, %(tool_calls)s, %(origin)s FROM charged
    WHERE %(record)s
    RETURNING id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at
)
SELECT recorded.* FROM charged LEFT JOIN recorded ON true
