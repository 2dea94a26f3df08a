-- A page of the keys for operators (never the hash), oldest first, of one user or app when given.
SELECT key_id, user_id, app_id, created_at, expires_at, last_used_at, revoked_at
FROM api_keys
WHERE (%(user_id)s::text IS NULL OR user_id = %(user_id)s) AND (%(app_id)s::text IS NULL OR app_id = %(app_id)s)
ORDER BY created_at, key_id
LIMIT %(limit)s OFFSET %(offset)s
