-- The sandboxes a user holds in an app, made or being made, one tree's own aside.
SELECT count(*) AS held
FROM sandbox_leases l
JOIN trees t ON t.tree_id = l.tree_id
WHERE t.user_id = %(user_id)s
  AND t.app_id = %(app_id)s
  AND l.tree_id <> %(tree_id)s
  AND l.state IN ('active', 'creating')
