-- One finished model call as its gateway accounts it (actors/gateway_actor.py), with the node it ran on.
INSERT INTO model_calls (run_id, model, prompt_tokens, completion_tokens, cost_usd, latency_ms, error, created_at,
                         node_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
