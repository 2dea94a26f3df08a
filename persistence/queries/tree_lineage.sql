-- The lineage a tree belongs to.
SELECT lineage_id FROM trees WHERE tree_id = %(tree_id)s
