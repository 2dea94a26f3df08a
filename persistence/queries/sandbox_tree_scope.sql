-- The scope a tree belongs to.
SELECT user_id, app_id FROM trees WHERE tree_id = %(tree_id)s
