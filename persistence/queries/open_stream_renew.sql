-- Keep an open stream counted, while its key is still live; no row: the stream must end.
UPDATE open_streams s SET expires_at = now() + make_interval(secs => %(seconds)s::float8)
FROM api_keys k
WHERE s.stream_id = %(stream_id)s AND k.key_id = s.key_id
  AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())
RETURNING s.stream_id
