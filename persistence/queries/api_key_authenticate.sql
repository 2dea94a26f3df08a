-- The live key with this hash (not revoked, not expired). Its last use is written only when
-- the stored one is older than touch_seconds, so a busy key costs no write per lookup (a
-- data-modifying WITH runs whether or not the outer query reads it).
WITH live AS (
    SELECT key_id, user_id, app_id, expires_at, last_used_at
    FROM api_keys
    WHERE key_hash = %(key_hash)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
), touched AS (
    UPDATE api_keys k SET last_used_at = now()
    FROM live
    WHERE k.key_id = live.key_id
      AND (live.last_used_at IS NULL OR live.last_used_at < now() - make_interval(secs => %(touch_seconds)s::float8))
    RETURNING k.key_id
)
SELECT key_id, user_id, app_id, expires_at FROM live
