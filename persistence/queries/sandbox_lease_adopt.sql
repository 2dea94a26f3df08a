-- Leases naming a node this life of the cluster does not know (Ray gave every node a new id when it
-- started again) follow that node's machine: to the live node at the address the old one had. The
-- sandbox, its workdir and a command still running in it are on that machine's disk and engine, so
-- nothing is lost and nothing released. A node the cluster knows as dead left it: not adopted.
UPDATE sandbox_leases l SET node_id = m.node_id
FROM ray_nodes n
JOIN unnest(%(addresses)s::text[], %(successors)s::text[]) AS m (address, node_id) ON m.address = n.address
WHERE l.node_id = n.node_id
  AND l.node_id <> ALL (%(known)s::text[])
  AND (%(tree_id)s::uuid IS NULL OR l.tree_id = %(tree_id)s)
RETURNING l.tree_id, n.node_id AS old_node_id, m.node_id
