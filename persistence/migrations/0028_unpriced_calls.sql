-- A call litellm has no price for is counted as such, not as a free one: a cost budget cannot count
-- it (canopy_budget_reached allows none under one), and its record says its cost is unknown.
ALTER TABLE tree_usage ADD COLUMN unpriced_calls bigint NOT NULL DEFAULT 0;
ALTER TABLE model_calls ALTER COLUMN cost_usd DROP NOT NULL;
CREATE OR REPLACE FUNCTION canopy_budget_reached(of_tree uuid) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('budget_tree_id', b.tree_id, 'limit', l.name, 'max', l.max, 'used', l.used)
    FROM trees t
    JOIN trees b ON b.tree_id = ANY (t.spawn_chain)
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(u.prompt_tokens + u.completion_tokens), 0)::float8 AS tokens,
               coalesce(sum(u.cost_usd), 0)::float8 AS cost_usd,
               coalesce(sum(u.model_calls), 0)::float8 AS model_calls,
               coalesce(extract(epoch FROM now() - min(u.first_run_at)), 0)::float8 AS seconds,
               coalesce(sum(u.unpriced_calls), 0)::float8 AS unpriced_calls
        FROM trees d JOIN tree_usage u ON u.tree_id = d.tree_id
        WHERE d.lineage_id = t.lineage_id AND b.tree_id = ANY (d.spawn_chain)) used
    CROSS JOIN LATERAL (VALUES ('tokens', b.budget_tokens::float8, used.tokens),
                               ('cost_usd', b.budget_cost_usd, used.cost_usd),
                               ('model_calls', b.budget_model_calls::float8, used.model_calls),
                               ('seconds', b.budget_seconds, used.seconds),
                               -- A cost budget cannot count a call litellm has no price for: it allows
                               -- none (used is NULL, never reached, while there is none).
                               ('unpriced_calls', CASE WHEN b.budget_cost_usd IS NOT NULL THEN 0::float8 END,
                                nullif(used.unpriced_calls, 0))) AS l (name, max, used)
    WHERE t.tree_id = of_tree
      AND (b.budget_tokens IS NOT NULL OR b.budget_cost_usd IS NOT NULL OR b.budget_seconds IS NOT NULL
           OR b.budget_model_calls IS NOT NULL)
      AND l.max IS NOT NULL AND l.used >= l.max
    ORDER BY array_position(t.spawn_chain, b.tree_id), l.name
    LIMIT 1
$$;
