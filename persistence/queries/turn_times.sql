SELECT created_at, ended_at FROM turns WHERE turn_id = %(turn_id)s
