-- A target session is read by its key alone, its scope checked on the row: given the scope's columns
-- too, a planner without fresh statistics took the scope's index (sessions_scope, migration 0027)
-- and read every session of the scope for each target of each wait a deadlock check walks.
CREATE OR REPLACE FUNCTION canopy_wait_on(of_kind text, of_condition jsonb, of_user text, of_app text)
RETURNS TABLE (target_position bigint, blocker uuid) LANGUAGE sql STABLE AS $$
    SELECT target.position,
           (SELECT CASE WHEN own.status IN ('running', 'waiting', 'cancelling') THEN own.turn_id
                        WHEN i.status = 'pending' THEN ahead.turn_id END
            FROM inputs i
            LEFT JOIN turns own ON own.input_id = i.input_id
            LEFT JOIN turns ahead ON ahead.session_id = i.session_id
                                 AND ahead.status IN ('running', 'waiting', 'cancelling')
            WHERE i.input_id = target.id::uuid AND i.user_id = of_user AND i.app_id = of_app)
    FROM jsonb_array_elements_text(of_condition -> 'input_ids') WITH ORDINALITY AS target (id, position)
    WHERE of_kind = 'inputs'
  UNION ALL
    SELECT target.position,
           (SELECT t.turn_id
            FROM (SELECT * FROM sessions WHERE session_id = target.id::uuid OFFSET 0) s
            JOIN turns t ON t.session_id = s.session_id AND t.status IN ('running', 'waiting', 'cancelling')
            WHERE s.user_id = of_user AND s.app_id = of_app)
    FROM jsonb_array_elements_text(of_condition -> 'targets') WITH ORDINALITY AS target (id, position)
    WHERE of_kind = 'sessions'
$$;
