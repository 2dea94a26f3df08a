-- A human's interventions that concern a session: on the session itself (found by the member it
-- names, events_interventions) and on its children (the event goes to the parent, events_session).
SELECT cursor, session_id AS parent_session_id, (payload->>'member_session_id')::uuid AS member_session_id,
       payload->>'path' AS path, payload->>'action' AS action, payload, created_at
FROM events
WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND kind = 'user_intervention' AND cursor > %(after)s
  AND (payload->>'member_session_id' = %(session_id)s::text OR session_id = %(session_id)s)
ORDER BY cursor
LIMIT %(limit)s
