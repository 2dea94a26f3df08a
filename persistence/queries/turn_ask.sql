-- A Turn that took in a message from an ask Turn asks for approvals from now on.
UPDATE turns SET approval_mode = 'ask' WHERE turn_id = %(turn_id)s AND approval_mode <> 'ask'
