-- A command killed by id, kept for its tree (sandbox_leases.mark_killed).
INSERT INTO killed_commands (tree_id, command_id) VALUES (%(tree_id)s, %(command_id)s)
ON CONFLICT DO NOTHING
