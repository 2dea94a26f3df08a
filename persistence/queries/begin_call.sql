-- A side-effecting tool call's first statement: whether the Run still holds its lease (its row
-- is locked if so, as runs.fence locks it) and the call's receipt if it ran before (locked for
-- the replay check; looked up only under the lease).
WITH fence AS (
    SELECT run_id FROM runs
    WHERE run_id = %(run_id)s AND owner = %(owner)s AND status = 'running' AND lease_expires_at > now()
    FOR NO KEY UPDATE
), receipt AS (
    SELECT tool_name, arguments, result, state FROM tool_receipts
    WHERE turn_id = %(turn_id)s AND tool_call_id = %(call_id)s AND EXISTS (SELECT 1 FROM fence)
    FOR UPDATE
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced, r.tool_name, r.arguments, r.result, r.state
FROM (SELECT) AS one LEFT JOIN receipt r ON true
