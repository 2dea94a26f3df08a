-- The live conversations of one scope, counted at each new one (persistence/quotas.py).
CREATE INDEX trees_scope_live ON trees (user_id, app_id) WHERE NOT archived;
