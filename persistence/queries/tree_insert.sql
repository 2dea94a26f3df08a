-- A new tree. Its lineage is itself, or the lineage of the tree that spawned it.
INSERT INTO trees (tree_id, user_id, app_id, project_id, slot_limit, lineage_id, spawned_by_tree_id)
VALUES (%(tree_id)s, %(user_id)s, %(app_id)s, %(project_id)s, %(slot_limit)s, %(lineage_id)s, %(spawned_by)s)
