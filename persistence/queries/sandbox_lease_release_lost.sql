-- Sandboxes on nodes that left the cluster went with them. Released, still naming the lost node
-- (where the tree's workdir was), so the tree's next command learns that its workdir is lost.
UPDATE sandbox_leases
SET state = 'released', handle = NULL, updated_at = now()
WHERE state <> 'released'
  AND node_id IS NOT NULL
  AND node_id <> ALL (%(alive)s::text[])
RETURNING tree_id, node_id
