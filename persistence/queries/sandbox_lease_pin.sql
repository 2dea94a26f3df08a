-- The node of a tree's sandbox and workdir, decided by the tree's first sandbox call, whatever it is
-- (sandbox_hosts.host_for): a lease row on that node with no sandbox yet, or that node given to a
-- lease with none and no sandbox. A lease that names a node keeps it.
INSERT INTO sandbox_leases (tree_id, backend, state, node_id)
VALUES (%(tree_id)s, %(backend)s, 'released', %(node_id)s)
ON CONFLICT (tree_id) DO UPDATE SET node_id = EXCLUDED.node_id
WHERE sandbox_leases.node_id IS NULL AND sandbox_leases.state = 'released'
