-- A reader's page of a session's messages, oldest first: at most %(limit)s, and none that begins
-- past %(max_bytes)s bytes of the page's text (content and tool calls, JSON-escaped as a response
-- carries them: a control character stored in one byte is six there; the first always comes).
-- ``available`` is how many of the first %(limit)s + 1 are there: more than the page holds says
-- that another page follows.
WITH head AS (
    SELECT id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at,
           coalesce(octet_length(to_json(content)::text), 0) + coalesce(octet_length(tool_calls::text), 0) AS size
    FROM thread_messages
    WHERE session_id = %(session_id)s AND id > %(after_id)s
    ORDER BY id
    LIMIT %(limit)s + 1
), sized AS (
    SELECT *, sum(size) OVER (ORDER BY id) - size AS before, row_number() OVER (ORDER BY id) AS n,
           count(*) OVER () AS available
    FROM head
)
SELECT id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at, available
FROM sized
WHERE n <= %(limit)s AND before < %(max_bytes)s
ORDER BY id
