-- A member's usage: the sum of its Runs' charges, kept as its tree's is (append_reply.sql), so that
-- the tree summary reads a row per member, not every Run the tree ever had. A session its Runs never
-- charged has no row.
CREATE TABLE session_usage (
    tree_id             uuid NOT NULL,
    session_id          uuid NOT NULL,
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd            double precision NOT NULL DEFAULT 0,
    model_calls         bigint NOT NULL DEFAULT 0,
    unpriced_calls      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tree_id, session_id),
    CONSTRAINT session_usage_session_fk FOREIGN KEY (session_id, tree_id) REFERENCES sessions (session_id, tree_id)
);
INSERT INTO session_usage (tree_id, session_id, prompt_tokens, completion_tokens, cost_usd, model_calls, unpriced_calls)
SELECT tree_id, session_id, sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), sum(model_calls),
       sum(unpriced_calls)
FROM runs GROUP BY tree_id, session_id
-- A summary charged before migration 0009 counted no model call, tokens and cost all the same.
HAVING sum(model_calls) > 0 OR sum(prompt_tokens) > 0 OR sum(completion_tokens) > 0 OR sum(cost_usd) <> 0
    OR sum(unpriced_calls) > 0;
-- Its one reader was the summary's sum: every Run written into it for nothing now.
DROP INDEX runs_tree;
