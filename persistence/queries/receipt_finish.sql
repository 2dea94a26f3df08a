-- A started sandbox command's outcome, recorded once (a stale incarnation is fenced out before).
UPDATE tool_receipts SET state = 'done', result = %(result)s
WHERE turn_id = %(turn_id)s AND tool_call_id = %(call_id)s AND state = 'started'
