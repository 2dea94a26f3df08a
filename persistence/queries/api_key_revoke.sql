-- Revoke keys (a second revocation keeps the first instant); the rows of those that exist. The
-- trigger api_keys_notify tells every API replica to forget each.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE key_id = ANY(%(key_ids)s::uuid[])
RETURNING key_id, user_id, app_id, created_at, expires_at, last_used_at, revoked_at
