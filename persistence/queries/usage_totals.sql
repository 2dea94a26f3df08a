-- Database-wide usage for metrics: every tree's usage summed, the trees with a budget, and the
-- trees stopped because a budget was reached.
SELECT coalesce(sum(u.prompt_tokens), 0)::bigint AS prompt_tokens,
       coalesce(sum(u.completion_tokens), 0)::bigint AS completion_tokens,
       coalesce(sum(u.cost_usd), 0)::float8 AS cost_usd, coalesce(sum(u.model_calls), 0)::bigint AS model_calls,
       count(*) FILTER (WHERE t.budget_tokens IS NOT NULL OR t.budget_cost_usd IS NOT NULL
                        OR t.budget_seconds IS NOT NULL OR t.budget_model_calls IS NOT NULL) AS trees_with_budget,
       count(*) FILTER (WHERE t.stopped AND t.stop_reason = 'budget_exceeded') AS trees_stopped_by_budget
FROM trees t JOIN tree_usage u ON u.tree_id = t.tree_id
