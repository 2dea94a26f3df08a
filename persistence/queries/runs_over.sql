-- Of the given Runs, those that are over: ended, or interrupted and resumed by another Run. A Run
-- handed back between two steps is still running (owned by nobody); one not found is not over.
SELECT run_id FROM runs WHERE run_id = ANY(%(run_ids)s) AND status NOT IN ('pending', 'running')
