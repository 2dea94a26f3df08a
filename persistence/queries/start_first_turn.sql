-- The first input of a session created in this transaction: nothing is queued or open there
-- and no other transaction can see the session yet, so the input is consumed at once by a new
-- Turn whose first Run is queued for a slot, and it becomes the first history message. The Turn
-- asks for approvals when its session does or when its input came from a Turn that does.
WITH input AS (
    INSERT INTO inputs (input_id, session_id, user_id, app_id, text, status, origin)
    VALUES (%(input_id)s, %(session_id)s, %(user_id)s, %(app_id)s, %(text)s, 'consumed', %(origin)s)
    RETURNING input_id
), turn AS (
    INSERT INTO turns (turn_id, session_id, input_id, approval_mode)
    SELECT %(turn_id)s, %(session_id)s, input.input_id,
           CASE WHEN s.agent_config->>'approval_mode' = 'ask' OR %(origin)s::jsonb->>'approval_mode' = 'ask'
                THEN 'ask' ELSE 'auto' END
    FROM input, sessions s WHERE s.session_id = %(session_id)s
    RETURNING turn_id
), run AS (
    INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind)
    SELECT %(run_id)s, turn_id, %(session_id)s, %(tree_id)s, 'start' FROM turn
    RETURNING run_id, turn_id
)
INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, origin)
SELECT %(session_id)s, turn_id, run_id, 'user', %(text)s, %(origin)s FROM run
