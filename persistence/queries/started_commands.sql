-- Sandbox commands a Run started whose outcome was never recorded: they may still be running.
SELECT r.turn_id, r.tool_call_id, runs.tree_id
FROM tool_receipts r JOIN runs ON runs.turn_id = r.turn_id
WHERE runs.run_id = %(run_id)s AND r.state = 'started'
