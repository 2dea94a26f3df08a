-- A Turn for a pending input. It asks for approvals when its session does, when its input came
-- from a Turn that does (work an ask session causes runs under ask), and once any earlier Turn of
-- its session asked: the history this Turn reads holds what that one took in (an input, a message,
-- a result from an ask Turn), which must not get a command run unasked by waiting a Turn.
INSERT INTO turns (turn_id, session_id, input_id, approval_mode)
SELECT %(turn_id)s, s.session_id, i.input_id,
       CASE WHEN s.agent_config->>'approval_mode' = 'ask' OR i.origin->>'approval_mode' = 'ask'
                 OR EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.session_id AND t.approval_mode = 'ask')
            THEN 'ask' ELSE 'auto' END
FROM sessions s JOIN inputs i ON i.session_id = s.session_id
WHERE s.session_id = %(session_id)s AND i.input_id = %(input_id)s
