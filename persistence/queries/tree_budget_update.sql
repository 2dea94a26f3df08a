-- A tree's whole budget (NULL: no limit); the caller holds the tree's lock.
UPDATE trees SET budget_tokens = %(budget_tokens)s, budget_cost_usd = %(budget_cost_usd)s,
                 budget_seconds = %(budget_seconds)s, budget_model_calls = %(budget_model_calls)s
WHERE tree_id = %(tree_id)s
