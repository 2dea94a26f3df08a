-- One model call's accounting record (positional: executed for many calls at once).
INSERT INTO model_calls (run_id, model, prompt_tokens, completion_tokens, cost_usd, latency_ms, error, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
