-- The open Turn of each session, if it has one.
SELECT s.session_id, t.turn_id
FROM sessions s
LEFT JOIN turns t ON t.session_id = s.session_id AND t.status IN ('running', 'waiting', 'cancelling')
WHERE s.session_id = ANY(%(ids)s) AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s
