-- The live nodes of the cluster and their addresses (a node's address does not change while it lives);
-- a node that is not live and that no lease names is forgotten: only a lease of an earlier life of
-- the cluster needs its node's address (to follow it, sandbox_lease_adopt.sql), so the table holds
-- the live nodes and the nodes leases name, not a row per node of every life.
WITH recorded AS (
    INSERT INTO ray_nodes (node_id, address)
    SELECT * FROM unnest(%(node_ids)s::text[], %(addresses)s::text[])
    ON CONFLICT (node_id) DO NOTHING
)
DELETE FROM ray_nodes n
WHERE n.node_id <> ALL (%(node_ids)s::text[])
  AND NOT EXISTS (SELECT 1 FROM sandbox_leases l WHERE l.node_id = n.node_id)
