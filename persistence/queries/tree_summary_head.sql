-- The head of a tree's summary in one statement: its state and why it stopped, its slots in use,
-- its budget, its usage and each member's (both kept by append_reply.sql; the members' one range of
-- session_usage), the usage of the trees spawned from it with
-- create_session(mode="root"), directly or not, and the first budget limit its work has reached.
SELECT t.tree_id, t.slot_limit, t.stopped, t.stopped_at, t.stop_reason, t.stop_detail, t.archived, t.lineage_id,
       t.spawned_by_tree_id, t.budget_tokens, t.budget_cost_usd, t.budget_seconds, t.budget_model_calls,
       (SELECT count(*) FROM runs r WHERE r.tree_id = t.tree_id AND r.status = 'running') AS slots_in_use,
       u.prompt_tokens, u.completion_tokens, u.cost_usd, u.model_calls, u.first_run_at, u.unpriced_calls,
       s.trees AS spawned_trees, s.prompt_tokens AS spawned_prompt_tokens,
       s.completion_tokens AS spawned_completion_tokens, s.cost_usd AS spawned_cost_usd,
       s.model_calls AS spawned_model_calls, s.unpriced_calls AS spawned_unpriced_calls,
       canopy_budget_reached(t.tree_id) AS budget_reached,
       (SELECT jsonb_object_agg(m.session_id, jsonb_build_array(m.prompt_tokens, m.completion_tokens, m.cost_usd,
                                                                 m.model_calls, m.unpriced_calls))
        FROM session_usage m WHERE m.tree_id = t.tree_id) AS member_usage
FROM trees t
JOIN tree_usage u ON u.tree_id = t.tree_id
CROSS JOIN LATERAL (
    SELECT count(*) AS trees, coalesce(sum(su.prompt_tokens), 0)::bigint AS prompt_tokens,
           coalesce(sum(su.completion_tokens), 0)::bigint AS completion_tokens,
           coalesce(sum(su.cost_usd), 0)::float8 AS cost_usd, coalesce(sum(su.model_calls), 0)::bigint AS model_calls,
           coalesce(sum(su.unpriced_calls), 0)::bigint AS unpriced_calls
    FROM trees d JOIN tree_usage su ON su.tree_id = d.tree_id
    WHERE d.lineage_id = t.lineage_id AND d.tree_id <> t.tree_id AND t.tree_id = ANY (d.spawn_chain)) s
WHERE t.tree_id = %(tree_id)s AND t.user_id = %(user_id)s AND t.app_id = %(app_id)s
