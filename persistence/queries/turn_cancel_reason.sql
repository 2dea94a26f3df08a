-- Why a Turn was cancelled while a Run executed it: the reason its cancel recorded (its latest
-- turn_cancelling event), for the Run that ends it.
SELECT payload->>'reason' AS reason
FROM events
WHERE session_id = %(session_id)s AND turn_id = %(turn_id)s AND kind = 'turn_cancelling'
ORDER BY cursor DESC
LIMIT 1
