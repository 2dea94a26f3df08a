-- The address of every Ray node that held sandboxes: a node's id is new with every start of Ray, so
-- a lease naming a node of an earlier life of the cluster is followed to the live node of the same
-- machine, whose disk still holds the workdir (actors/sandbox_hosts.py).
CREATE TABLE ray_nodes (
    node_id     text PRIMARY KEY,
    address     text NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now()
);
