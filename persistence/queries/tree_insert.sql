-- A new tree and its usage row. Its lineage is itself, or the lineage of the tree that spawned it;
-- its spawn chain is the spawning tree's chain followed by itself.
WITH tree AS (
    INSERT INTO trees (tree_id, user_id, app_id, project_id, slot_limit, lineage_id, spawned_by_tree_id, spawn_chain,
                       budget_tokens, budget_cost_usd, budget_seconds, budget_model_calls)
    SELECT %(tree_id)s, %(user_id)s, %(app_id)s, %(project_id)s, %(slot_limit)s, %(lineage_id)s, %(spawned_by)s,
           coalesce((SELECT spawn_chain FROM trees WHERE tree_id = %(spawned_by)s), '{}') || %(tree_id)s::uuid,
           %(budget_tokens)s, %(budget_cost_usd)s, %(budget_seconds)s, %(budget_model_calls)s
    RETURNING tree_id
)
INSERT INTO tree_usage (tree_id) SELECT tree_id FROM tree
