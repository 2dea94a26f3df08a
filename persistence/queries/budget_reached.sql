-- The first budget limit the work of a tree has reached, or NULL (see canopy_budget_reached).
SELECT canopy_budget_reached(%(tree_id)s) AS reached
