-- Usage per tree and tree budgets: the spawn chain of each tree, its budget and why it stopped;
-- the model replies each Run committed; per-tree usage kept with the Runs' charges (filled from
-- the runs already there); agents' default budgets; interventions found from their member.
ALTER TABLE trees ADD COLUMN spawn_chain uuid[];
WITH RECURSIVE chain AS (
    SELECT tree_id, ARRAY[tree_id] AS spawn_chain FROM trees WHERE spawned_by_tree_id IS NULL
    UNION ALL
    SELECT t.tree_id, c.spawn_chain || t.tree_id FROM trees t JOIN chain c ON t.spawned_by_tree_id = c.tree_id
)
UPDATE trees SET spawn_chain = chain.spawn_chain FROM chain WHERE chain.tree_id = trees.tree_id;
ALTER TABLE trees ALTER COLUMN spawn_chain SET NOT NULL;
ALTER TABLE trees ADD COLUMN budget_tokens bigint;
ALTER TABLE trees ADD COLUMN budget_cost_usd double precision;
ALTER TABLE trees ADD COLUMN budget_seconds double precision;
ALTER TABLE trees ADD COLUMN budget_model_calls bigint;
ALTER TABLE trees ADD COLUMN stop_reason text;
ALTER TABLE trees ADD COLUMN stop_detail jsonb;
UPDATE trees SET stop_reason = 'user' WHERE stopped;
ALTER TABLE trees ADD CONSTRAINT trees_budget_positive CHECK (
    coalesce(budget_tokens, 1) > 0 AND coalesce(budget_cost_usd, 1) > 0 AND coalesce(budget_seconds, 1) > 0
    AND coalesce(budget_model_calls, 1) > 0);
ALTER TABLE trees ADD CONSTRAINT trees_stop_reason_check CHECK (stop_reason IN ('user', 'budget_exceeded'));

ALTER TABLE agents ADD COLUMN budget jsonb;

ALTER TABLE runs ADD COLUMN model_calls integer NOT NULL DEFAULT 0;
UPDATE runs r SET model_calls = m.n
FROM (SELECT run_id, count(*) AS n FROM thread_messages WHERE role = 'assistant' GROUP BY run_id) m
WHERE m.run_id = r.run_id;
CREATE INDEX runs_tree ON runs (tree_id, session_id);

CREATE TABLE tree_usage (
    tree_id             uuid PRIMARY KEY REFERENCES trees (tree_id),
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd            double precision NOT NULL DEFAULT 0,
    model_calls         bigint NOT NULL DEFAULT 0,
    first_run_at        timestamptz
);
INSERT INTO tree_usage (tree_id, prompt_tokens, completion_tokens, cost_usd, model_calls, first_run_at)
SELECT t.tree_id, coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.completion_tokens), 0),
       coalesce(sum(r.cost_usd), 0), coalesce(sum(r.model_calls), 0), min(r.started_at)
FROM trees t LEFT JOIN runs r ON r.tree_id = t.tree_id
GROUP BY t.tree_id;

CREATE FUNCTION canopy_budget_reached(of_tree uuid) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('budget_tree_id', b.tree_id, 'limit', l.name, 'max', l.max, 'used', l.used)
    FROM trees t
    JOIN trees b ON b.tree_id = ANY (t.spawn_chain)
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(u.prompt_tokens + u.completion_tokens), 0)::float8 AS tokens,
               coalesce(sum(u.cost_usd), 0)::float8 AS cost_usd,
               coalesce(sum(u.model_calls), 0)::float8 AS model_calls,
               coalesce(extract(epoch FROM now() - min(u.first_run_at)), 0)::float8 AS seconds
        FROM trees d JOIN tree_usage u ON u.tree_id = d.tree_id
        WHERE d.lineage_id = t.lineage_id AND b.tree_id = ANY (d.spawn_chain)) used
    CROSS JOIN LATERAL (VALUES ('tokens', b.budget_tokens::float8, used.tokens),
                               ('cost_usd', b.budget_cost_usd, used.cost_usd),
                               ('model_calls', b.budget_model_calls::float8, used.model_calls),
                               ('seconds', b.budget_seconds, used.seconds)) AS l (name, max, used)
    WHERE t.tree_id = of_tree
      AND (b.budget_tokens IS NOT NULL OR b.budget_cost_usd IS NOT NULL OR b.budget_seconds IS NOT NULL
           OR b.budget_model_calls IS NOT NULL)
      AND l.max IS NOT NULL AND l.used >= l.max
    ORDER BY array_position(t.spawn_chain, b.tree_id), l.name
    LIMIT 1
$$;

CREATE INDEX events_interventions ON events ((payload->>'member_session_id'), cursor)
    WHERE kind = 'user_intervention';
