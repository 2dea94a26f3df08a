-- A Turn's status and approval mode.
SELECT status, approval_mode FROM turns WHERE turn_id = %(turn_id)s
