-- Revoke a key (a second revocation keeps the first instant). The trigger api_keys_notify
-- tells every API replica to forget it.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE key_id = %(key_id)s
RETURNING key_id, user_id, app_id, created_at, expires_at, last_used_at, revoked_at
