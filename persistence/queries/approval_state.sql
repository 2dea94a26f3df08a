-- The latest approval request of one tool call of a Turn, and its answer.
SELECT w.status AS wait_status, r.status AS request_status, r.response
FROM waits w JOIN requests r ON r.wait_id = w.wait_id
WHERE w.turn_id = %(turn_id)s AND w.tool_call_id = %(call_id)s AND w.kind = 'approval'
ORDER BY w.created_at DESC LIMIT 1
