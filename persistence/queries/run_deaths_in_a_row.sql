-- The Runs of a Turn that lost their lease since its last Run that made progress (committed a
-- model reply): those in a row that died before getting anywhere. A Turn that gets somewhere in
-- each Run survives any number of outages; one whose Runs die before their first reply does not.
-- A granted Run no process ever took counts too: a session that cannot start is no better off.
SELECT count(*) AS n
FROM runs r
WHERE r.turn_id = %(turn_id)s AND r.error = %(lease_expired)s
  AND r.started_at > coalesce((SELECT max(p.started_at) FROM runs p
                               WHERE p.turn_id = %(turn_id)s
                                 AND EXISTS (SELECT 1 FROM thread_messages m
                                             WHERE m.turn_id = %(turn_id)s AND m.role = 'assistant'
                                               AND m.run_id = p.run_id)), '-infinity')
