-- The scope's open cooperation waits: each waiting Turn, where it is, and what it waits for.
SELECT w.turn_id, w.kind, w.condition, s.session_id, s.path, s.tree_id
FROM waits w JOIN sessions s ON s.session_id = w.session_id
WHERE w.status = 'open' AND w.kind IN ('inputs', 'sessions')
  AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s
