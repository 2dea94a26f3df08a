-- How many trees a lineage has spawned (every tree of it but its first).
SELECT count(*) AS spawned FROM trees WHERE lineage_id = %(lineage_id)s AND tree_id <> %(lineage_id)s
