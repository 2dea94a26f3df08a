-- Whether a command was killed before it started (sandbox_leases.was_killed).
SELECT 1 FROM killed_commands WHERE tree_id = %(tree_id)s AND command_id = %(command_id)s
