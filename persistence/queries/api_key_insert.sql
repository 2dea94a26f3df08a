-- A new key of a scope; its expiry is an instant, a number of seconds from now (the database's
-- clock), or none.
INSERT INTO api_keys (key_hash, user_id, app_id, expires_at)
VALUES (%(key_hash)s, %(user_id)s, %(app_id)s,
        coalesce(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)))
RETURNING key_id, user_id, app_id, created_at, expires_at, last_used_at, revoked_at
