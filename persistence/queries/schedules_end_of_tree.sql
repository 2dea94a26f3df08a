-- The live schedules of a tree's sessions end, as a delete ends one (their firings stay on record).
UPDATE schedules SET deleted_at = now()
WHERE deleted_at IS NULL AND session_id IN (SELECT session_id FROM sessions WHERE tree_id = %(tree_id)s)
