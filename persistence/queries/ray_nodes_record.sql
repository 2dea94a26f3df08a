-- The live nodes of the cluster and their addresses (a node's address does not change while it lives).
INSERT INTO ray_nodes (node_id, address)
SELECT * FROM unnest(%(node_ids)s::text[], %(addresses)s::text[])
ON CONFLICT (node_id) DO NOTHING
