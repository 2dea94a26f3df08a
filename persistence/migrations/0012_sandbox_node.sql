-- A sandbox per node's host: the lease names the node holding the sandbox and its workdir, and
-- when a command last found that node gone (the workdir was lost, the tree moved to a new node).
ALTER TABLE sandbox_leases ADD COLUMN node_id text;
ALTER TABLE sandbox_leases ADD COLUMN workdir_lost_at timestamptz;
