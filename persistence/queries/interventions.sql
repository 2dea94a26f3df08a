-- A human's interventions that concern a session: on the session itself (found by the member it
-- names, events_interventions) and on its children (the event goes to the parent,
-- events_interventions_session). Apart, each one ordered range: together as one OR, the planner
-- read every intervention of the database, or every event of the session. No event is in both: a
-- member's intervention goes to its parent.
(SELECT cursor, session_id AS parent_session_id, (payload->>'member_session_id')::uuid AS member_session_id,
        payload->>'path' AS path, payload->>'action' AS action, payload, created_at
 FROM events
 WHERE kind = 'user_intervention' AND payload->>'member_session_id' = %(session_id)s::text
   AND cursor > %(after)s AND user_id = %(user_id)s AND app_id = %(app_id)s
 ORDER BY cursor LIMIT %(limit)s)
UNION ALL
(SELECT cursor, session_id, (payload->>'member_session_id')::uuid, payload->>'path', payload->>'action', payload,
        created_at
 FROM events
 WHERE kind = 'user_intervention' AND session_id = %(session_id)s
   AND cursor > %(after)s AND user_id = %(user_id)s AND app_id = %(app_id)s
 ORDER BY cursor LIMIT %(limit)s)
ORDER BY cursor
LIMIT %(limit)s
