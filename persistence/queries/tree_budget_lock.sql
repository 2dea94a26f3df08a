-- A tree's budget, its row locked like stop and continue lock it (a budget change and a continue
-- that checks the budget are serialised).
SELECT budget_tokens, budget_cost_usd, budget_seconds, budget_model_calls FROM trees
WHERE tree_id = %(tree_id)s AND user_id = %(user_id)s AND app_id = %(app_id)s
FOR NO KEY UPDATE
