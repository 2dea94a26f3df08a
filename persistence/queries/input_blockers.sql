-- What each input waits for before it can end: its own open Turn, or, while it is queued, the open
-- Turn of its session ahead of it (FIFO). Neither: it has ended, or it starts as soon as it can.
SELECT i.input_id,
       CASE WHEN own.status IN ('running', 'waiting', 'cancelling') THEN own.turn_id
            WHEN i.status = 'pending' THEN ahead.turn_id END AS blocker
FROM inputs i
LEFT JOIN turns own ON own.input_id = i.input_id
LEFT JOIN turns ahead ON ahead.session_id = i.session_id AND ahead.status IN ('running', 'waiting', 'cancelling')
WHERE i.input_id = ANY(%(ids)s) AND i.user_id = %(user_id)s AND i.app_id = %(app_id)s
