-- The node holding the tree's sandbox left the cluster: the sandbox and its workdir went with it.
-- The tree's next sandbox is built on %(node_id)s; only if the lease still names the lost node.
UPDATE sandbox_leases
SET state = 'released', handle = NULL, node_id = %(node_id)s, workdir_lost_at = now(), updated_at = now()
WHERE tree_id = %(tree_id)s AND node_id = %(lost_node_id)s
RETURNING tree_id
