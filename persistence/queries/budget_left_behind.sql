-- The nearest tree with a budget over the calling tree (its own, or one up its spawn chain) that
-- does not cover the target tree (not in its spawn chain): work submitted there would not count.
SELECT b.tree_id
FROM trees c
JOIN trees b ON b.tree_id = ANY (c.spawn_chain)
WHERE c.tree_id = %(caller)s
  AND (b.budget_tokens IS NOT NULL OR b.budget_cost_usd IS NOT NULL OR b.budget_seconds IS NOT NULL
       OR b.budget_model_calls IS NOT NULL)
  AND NOT EXISTS (SELECT 1 FROM trees t WHERE t.tree_id = %(target)s AND b.tree_id = ANY (t.spawn_chain))
ORDER BY array_position(c.spawn_chain, b.tree_id) DESC
LIMIT 1
