-- Every interval and instant of one tree's timeline, derived from the durable facts in one
-- statement whatever the tree's size. Rows are keyed by (start_at, kind, id): a page continues
-- strictly after the last key it returned, so pages neither repeat nor skip a row.
--
-- Clocks: runs.queued_at/started_at/ended_at use clock_timestamp() (the real moment inside
-- their transaction); waits, requests and thread_messages use now() (their transaction's
-- start). A wait is parked in the transaction that interrupts its Run, so the wait starts at
-- that Run's ended_at, not at the earlier now() of waits.created_at; it ends when its resume
-- Run is queued. A model call's row holds its end time and its latency.
--
-- since: only rows that may have changed after that moment (still open, or ended after it).
-- ended_after: every item of a Turn starts and ends by the time the Turn ends (within the slack
-- persistence/timeline.py takes off), so a Turn that ended before it holds nothing the read returns,
-- and is not expanded at all (the web UI repeats a "since" read while the tree runs: it costs what
-- is open or recent, not the tree's history).
WITH member AS (
    SELECT s.session_id, s.path FROM sessions s
    WHERE s.tree_id = %(tree_id)s AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s
), turn AS (
    SELECT t.turn_id, t.session_id, t.status, t.ended_at, m.path
    FROM member m JOIN turns t ON t.session_id = m.session_id
    -- Open (no end yet) or ended after: one range of turns_ended per member, however long its history.
    WHERE coalesce(t.ended_at, 'infinity'::timestamptz)
          >= coalesce(%(ended_after)s::timestamptz, '-infinity'::timestamptz)
), run AS (
    SELECT r.run_id, r.turn_id, r.session_id, r.kind, r.status, r.error, r.queued_at, r.started_at, r.ended_at,
           r.prompt_tokens, r.completion_tokens, r.cost_usd, t.path, t.ended_at AS turn_ended_at
    FROM turn t JOIN runs r ON r.turn_id = t.turn_id
), wait AS (
    SELECT w.wait_id, w.session_id, w.turn_id, w.run_id, w.kind, w.status, r.path,
           coalesce(r.ended_at, w.created_at) AS start_at,
           CASE w.status WHEN 'resumed' THEN resume.queued_at WHEN 'cancelled' THEN r.turn_ended_at END AS end_at,
           r.turn_ended_at
    FROM run r JOIN waits w ON w.run_id = r.run_id
    LEFT JOIN runs resume ON resume.run_id = w.resumed_run_id
), item AS (
    SELECT 'run' AS kind, r.run_id::text AS id, r.session_id, r.path, r.started_at AS start_at, r.ended_at AS end_at,
           r.status, r.error, r.run_id, r.turn_id, NULL::uuid AS wait_id, NULL::uuid AS request_id, r.kind AS name,
           r.prompt_tokens, r.completion_tokens, r.cost_usd, NULL::uuid[] AS targets
    FROM run r WHERE r.started_at IS NOT NULL
    UNION ALL
    SELECT 'queued', r.run_id::text, r.session_id, r.path, r.queued_at, coalesce(r.started_at, r.ended_at),
           CASE WHEN r.started_at IS NOT NULL THEN 'granted' WHEN r.ended_at IS NOT NULL THEN r.status
                ELSE 'pending' END,
           NULL, r.run_id, r.turn_id, NULL, NULL, r.kind, 0, 0, 0, NULL
    FROM run r
    UNION ALL
    SELECT 'wait', w.wait_id::text, w.session_id, w.path, w.start_at, w.end_at, w.status, NULL, w.run_id, w.turn_id,
           w.wait_id, NULL, w.kind, 0, 0, 0,
           ARRAY(SELECT wt.session_id FROM wait_targets wt WHERE wt.wait_id = w.wait_id ORDER BY wt.session_id)
    FROM wait w
    UNION ALL
    SELECT CASE q.kind WHEN 'approval' THEN 'approval' ELSE 'question' END, q.request_id::text, w.session_id, w.path,
           w.start_at,
           CASE q.status WHEN 'answered' THEN q.answered_at WHEN 'cancelled' THEN w.turn_ended_at END,
           q.status, NULL, w.run_id, w.turn_id, w.wait_id, q.request_id, q.kind, 0, 0, 0, NULL
    FROM wait w JOIN requests q ON q.wait_id = w.wait_id
    UNION ALL
    SELECT 'model_call', c.id::text, r.session_id, r.path, c.created_at - make_interval(secs => c.latency_ms / 1000),
           c.created_at, CASE WHEN c.error IS NULL THEN 'ok' ELSE 'error' END, c.error, r.run_id, r.turn_id, NULL,
           NULL, c.model, c.prompt_tokens, c.completion_tokens, c.cost_usd, NULL
    FROM run r JOIN model_calls c ON c.run_id = r.run_id
    UNION ALL
    -- A tool call starts when the reply that made it is committed and ends when its result is (or,
    -- with no result yet, its receipt: the moment a side effect finished; a command's receipt is
    -- committed 'started' as it begins, and that call is open until its outcome); a call whose Turn
    -- ended without a result ends with the Turn. Replies are reached from the Turns the read keeps,
    -- by their Turn's key: a plan that stays right when the planner's row estimates are not (a tree
    -- that just grew, before autovacuum analyses it).
    SELECT 'tool_call', m.turn_id::text || ':' || (tc.call ->> 'id'), m.session_id, t.path, m.created_at,
           coalesce(result.created_at, CASE WHEN receipt.state = 'done' THEN receipt.created_at END,
                    CASE WHEN t.status IN ('completed', 'failed', 'cancelled') THEN t.ended_at END),
           CASE WHEN result.id IS NULL AND (receipt.turn_id IS NULL OR receipt.state = 'started')
                THEN CASE WHEN t.status IN ('completed', 'failed', 'cancelled') THEN 'abandoned' ELSE 'open' END
                WHEN left(result.content, 9) = '{"error":' THEN 'error' ELSE 'ok' END,
           CASE WHEN left(result.content, 9) = '{"error":' THEN left(result.content, 300) END,
           m.run_id, m.turn_id, NULL, NULL, tc.call ->> 'name', 0, 0, 0, NULL
    FROM turn t
    JOIN thread_messages m ON m.turn_id = t.turn_id AND m.role = 'assistant' AND jsonb_typeof(m.tool_calls) = 'array'
    CROSS JOIN LATERAL jsonb_array_elements(m.tool_calls) AS tc (call)
    LEFT JOIN thread_messages result ON result.turn_id = m.turn_id AND result.role = 'tool'
                                        AND result.tool_call_id = tc.call ->> 'id'
    LEFT JOIN tool_receipts receipt ON receipt.turn_id = m.turn_id AND receipt.tool_call_id = tc.call ->> 'id'
    UNION ALL
    SELECT CASE e.kind WHEN 'tree_stopped' THEN 'stop' ELSE 'continue' END, e.cursor::text, e.session_id, '/root',
           e.created_at, e.created_at, NULL, NULL, NULL, NULL, NULL, NULL, e.kind, 0, 0, 0, NULL
    FROM events e
    WHERE e.tree_id = %(tree_id)s AND e.user_id = %(user_id)s AND e.app_id = %(app_id)s
      AND e.kind IN ('tree_stopped', 'tree_continued')
)
SELECT * FROM item
WHERE (%(since)s::timestamptz IS NULL OR end_at IS NULL OR end_at >= %(since)s::timestamptz)
  AND (%(after_start)s::timestamptz IS NULL
       OR (start_at, kind, id) > (%(after_start)s::timestamptz, %(after_kind)s::text, %(after_id)s::text))
ORDER BY start_at, kind, id
LIMIT %(limit)s
