-- A tree with a running Run is in use, however long ago its sandbox was last touched.
SELECT EXISTS (SELECT 1 FROM runs WHERE tree_id = %(tree_id)s AND status = 'running') AS running
