-- The waits a new wait would join: the new one (given), and every open cooperation wait reachable
-- from it along what each is stuck behind (canopy_wait_on), each with those Turns in target order.
-- A check reads only the waits a cycle through the new one could contain, not every open wait of
-- the scope. UNION ends the walk where it meets a wait it has already read. OFFSET 0 keeps the
-- lookup of a Turn's open wait a lookup by its index: flattened into a join, a planner without
-- fresh statistics hashes every open wait instead.
WITH RECURSIVE graph (turn_id, wait_id, needs_all, path, tree_id, waits_on) AS (
    SELECT %(turn_id)s::uuid, NULL::uuid, %(kind)s::text = 'inputs', %(label)s::text, %(tree_id)s::uuid,
           ARRAY(SELECT o.blocker FROM canopy_wait_on(%(kind)s, %(condition)s, %(user_id)s, %(app_id)s) o
                 ORDER BY o.target_position)
  UNION
    SELECT w.turn_id, w.wait_id, w.kind = 'inputs', s.path, s.tree_id,
           ARRAY(SELECT o.blocker FROM canopy_wait_on(w.kind, w.condition, %(user_id)s, %(app_id)s) o
                 ORDER BY o.target_position)
    FROM graph g
    CROSS JOIN LATERAL unnest(g.waits_on) AS behind (turn_id)
    CROSS JOIN LATERAL (SELECT * FROM waits
                        WHERE waits.turn_id = behind.turn_id AND waits.status = 'open'
                          AND waits.kind IN ('inputs', 'sessions')
                        OFFSET 0) AS w
    JOIN sessions s ON s.session_id = w.session_id AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s
)
SELECT turn_id, wait_id, needs_all, path, tree_id, waits_on FROM graph
