-- The waits a new wait would join: the new one (given), and every open cooperation wait reachable
-- from it along what each is stuck behind (canopy_wait_on), each with those Turns in target order.
-- A check reads only the waits a cycle through the new one could contain, not every open wait of
-- the scope. The walk carries Turn ids alone, so UNION drops a Turn met again before its wait's
-- targets are looked up: each reached wait's targets are read once to walk on and once for its
-- row, whatever number of waits reach it (carrying each wait's array of Turns through the walk
-- read them again for every edge into it: 2.7 s for 200 waits of 100 targets each).
-- The walk's steps are lookups by index whatever the statistics say, as a step runs once per wait
-- of a chain: a Turn's open wait in a subquery with OFFSET 0 (flattened into a join, a planner
-- without fresh statistics hashes every open wait), its targets in a subquery per wait, and no
-- sessions join in the walk, a session read by its key alone where one is read (given the scope's
-- columns too, a planner without fresh statistics could take an index of the scope's sessions and
-- read all of them once per wait: a 1,000-wait chain took seconds). canopy_wait_on keeps
-- the walk in the scope: it only finds the scope's inputs and sessions, so every Turn reached, and
-- its wait, is the scope's; the rows read back are checked again.
WITH RECURSIVE reached (turn_id) AS (
    SELECT o.blocker FROM canopy_wait_on(%(kind)s, %(condition)s, %(user_id)s, %(app_id)s) o
    WHERE o.blocker IS NOT NULL
  UNION
    SELECT behind.turn_id
    FROM reached r
    CROSS JOIN LATERAL (SELECT * FROM waits
                        WHERE waits.turn_id = r.turn_id AND waits.status = 'open'
                          AND waits.kind IN ('inputs', 'sessions')
                        OFFSET 0) AS w
    CROSS JOIN LATERAL unnest(ARRAY(SELECT o.blocker FROM canopy_wait_on(w.kind, w.condition, %(user_id)s,
                                                                         %(app_id)s) o)) AS behind (turn_id)
    WHERE behind.turn_id IS NOT NULL
)
SELECT %(turn_id)s::uuid AS turn_id, NULL::uuid AS wait_id, %(kind)s::text = 'inputs' AS needs_all,
       %(label)s::text AS path, %(tree_id)s::uuid AS tree_id,
       ARRAY(SELECT o.blocker FROM canopy_wait_on(%(kind)s, %(condition)s, %(user_id)s, %(app_id)s) o
             ORDER BY o.target_position) AS waits_on
UNION ALL
SELECT w.turn_id, w.wait_id, w.kind = 'inputs', s.path, s.tree_id,
       ARRAY(SELECT o.blocker FROM canopy_wait_on(w.kind, w.condition, %(user_id)s, %(app_id)s) o
             ORDER BY o.target_position)
FROM reached r
CROSS JOIN LATERAL (SELECT * FROM waits
                    WHERE waits.turn_id = r.turn_id AND waits.status = 'open' AND waits.kind IN ('inputs', 'sessions')
                    OFFSET 0) AS w
CROSS JOIN LATERAL (SELECT * FROM sessions WHERE sessions.session_id = w.session_id OFFSET 0) AS s
WHERE s.user_id = %(user_id)s AND s.app_id = %(app_id)s
