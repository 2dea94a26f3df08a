-- A tree's members in tree order (a parent right before its subtree: arrays of path segments
-- compare segment by segment, where plain text would put '/root/a-b' between '/root/a' and its
-- children), with the read's time for the next "what changed since" read.
SELECT now() AS as_of, s.session_id, s.parent_id, s.name, s.path, s.depth, s.title
FROM sessions s
WHERE s.tree_id = %(tree_id)s AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s
ORDER BY string_to_array(s.path, '/')
