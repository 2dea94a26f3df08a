-- Whether a Turn's thread already holds the result of one tool call.
SELECT 1 FROM thread_messages WHERE turn_id = %(turn_id)s AND tool_call_id = %(tool_call_id)s AND role = 'tool'
