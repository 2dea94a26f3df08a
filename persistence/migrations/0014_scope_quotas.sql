-- What one scope holds of each kind with a quota, counted at each create (persistence/quotas.py).
CREATE INDEX projects_scope ON projects (user_id, app_id);
CREATE INDEX agents_owner ON agents (app_id, owner_user_id);
CREATE INDEX schedules_scope ON schedules (user_id, app_id) WHERE deleted_at IS NULL;
