-- A notification on a channel (delivered to its listeners at the commit).
SELECT pg_notify(%(channel)s, %(payload)s)
