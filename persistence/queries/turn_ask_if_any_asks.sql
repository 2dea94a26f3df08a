-- A Turn that took in what an ask Turn produced (a result, an update) asks for approvals from now on.
UPDATE turns SET approval_mode = 'ask'
WHERE turn_id = %(turn_id)s AND approval_mode <> 'ask'
  AND EXISTS (SELECT 1 FROM turns WHERE turn_id = ANY(%(sources)s) AND approval_mode = 'ask')
