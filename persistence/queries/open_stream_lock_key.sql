-- Serialises the stream opens of one key across replicas; only a live key opens streams.
SELECT key_id FROM api_keys
WHERE key_id = %(key_id)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
FOR UPDATE
