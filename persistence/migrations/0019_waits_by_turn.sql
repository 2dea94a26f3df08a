-- The Turns a cooperation wait is stuck behind, one row per target in target order (NULL for a
-- target that is free: ended, idle, or starting as soon as it can). An input waits for its own
-- open Turn, or, while it is queued, for the open Turn of its session ahead of it (FIFO); a session
-- for its open Turn. The deadlock check walks the waits along these (wait_graph.sql). Each target is
-- looked up by its key, so a call costs its targets' index lookups whatever the tables' statistics.
CREATE FUNCTION canopy_wait_on(of_kind text, of_condition jsonb, of_user text, of_app text)
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
            FROM sessions s JOIN turns t ON t.session_id = s.session_id
                                        AND t.status IN ('running', 'waiting', 'cancelling')
            WHERE s.session_id = target.id::uuid AND s.user_id = of_user AND s.app_id = of_app)
    FROM jsonb_array_elements_text(of_condition -> 'targets') WITH ORDINALITY AS target (id, position)
    WHERE of_kind = 'sessions'
$$;
-- A Turn's waits: its open one, found by the deadlock check's walk along the waits (wait_graph.sql),
-- and its latest resumed one, whose outcome a resume Run delivers (persistence/waits.py).
CREATE INDEX waits_turn ON waits (turn_id, created_at);
