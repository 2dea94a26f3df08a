-- One model gateway per Ray node: each call's record names the node whose gateway made it.
ALTER TABLE model_calls ADD COLUMN node_id text;
