-- A new open stream of the key unless it already holds `limit` live ones. Runs after
-- open_stream_lock_key in the same transaction, as a statement of its own: its snapshot then
-- includes every open that committed while this one waited for the lock.
WITH gone AS (
    DELETE FROM open_streams WHERE key_id = %(key_id)s AND expires_at <= now()
), held AS (
    SELECT count(*) AS n FROM open_streams WHERE key_id = %(key_id)s AND expires_at > now()
)
INSERT INTO open_streams (stream_id, key_id, expires_at)
SELECT %(stream_id)s, %(key_id)s, now() + make_interval(secs => %(seconds)s::float8)
FROM held WHERE held.n < %(limit)s
RETURNING stream_id
