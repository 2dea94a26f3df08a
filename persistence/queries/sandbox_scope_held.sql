-- The sandboxes the tree's user holds in its app, made or being made, the tree's own aside.
SELECT count(*) AS held
FROM trees t
JOIN trees o ON o.user_id = t.user_id AND o.app_id = t.app_id
JOIN sandbox_leases l ON l.tree_id = o.tree_id
WHERE t.tree_id = %(tree_id)s
  AND o.tree_id <> t.tree_id
  AND l.state IN ('active', 'creating')
