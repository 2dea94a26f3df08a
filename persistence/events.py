"""The event log: one cursor sequence per scope, never observed out of commit order.

The cursor comes from the scope's counter row, locked by the appending transaction
until it commits, so two appenders in one scope serialise and a reader that has seen
cursor N can never later see a smaller cursor appear. Inside ``Database.tx`` the events
are written last, just before the commit (``persistence.db.run_last``), whatever point of
the transaction appended them: the scope's lock is then held for the commit only, and
concurrent writers of one scope do the rest of their work in parallel.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from persistence.db import Connection, run_last
from persistence.records import Row, Scope

# The kinds a wait_sessions waiter treats as an update of a target session.
SESSION_UPDATE_KINDS = (
    "turn_completed",
    "turn_failed",
    "turn_cancelled",
    "waiting_approval",
    "waiting_answer",
    "coop_message",
)

# One statement: the scope's next cursor (locking its counter row until commit) and the event.
_APPEND_EVENT = """
WITH counter AS (
    UPDATE scopes SET last_cursor = last_cursor + 1
    WHERE user_id = %(user_id)s AND app_id = %(app_id)s
    RETURNING last_cursor
)
INSERT INTO events (user_id, app_id, cursor, kind, session_id, tree_id, turn_id, run_id, payload)
SELECT %(user_id)s, %(app_id)s, last_cursor, %(kind)s, %(session_id)s, %(tree_id)s, %(turn_id)s, %(run_id)s,
       %(payload)s
FROM counter
"""

_EVENTS_AFTER = """
SELECT cursor, kind, session_id, tree_id, turn_id, run_id, payload, created_at
FROM events
WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND cursor > %(after)s
  AND (%(session_id)s::uuid IS NULL OR session_id = %(session_id)s)
  AND (%(tree_id)s::uuid IS NULL OR tree_id = %(tree_id)s)
ORDER BY cursor
LIMIT %(limit)s
"""

_SESSION_UPDATES_AFTER = """
SELECT cursor, kind, session_id, turn_id, run_id, payload, created_at
FROM events
WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND cursor > %(after)s
  AND session_id = ANY(%(targets)s) AND kind = ANY(%(kinds)s)
  AND (kind <> 'coop_message' OR payload->>'receiver_session_id' = %(waiter)s::text)
ORDER BY cursor
LIMIT %(limit)s
"""


async def append_event(
    conn: Connection,
    scope: Scope,
    kind: str,
    *,
    session_id: uuid.UUID | None = None,
    tree_id: uuid.UUID | None = None,
    turn_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
) -> None:
    """Append an event: at the end of the enclosing ``Database.tx`` block, else at once."""
    params = {"user_id": scope.user_id, "app_id": scope.app_id, "kind": kind, "session_id": session_id,
              "tree_id": tree_id, "turn_id": turn_id, "run_id": run_id, "payload": Jsonb(payload or {})}

    async def write(connection: Connection) -> None:
        cur = await connection.execute(_APPEND_EVENT, params)
        assert cur.rowcount == 1, "scope row missing: ensure_scope() first"

    if not run_last(conn, write):
        await write(conn)


async def events_after(
    conn: Connection,
    scope: Scope,
    after: int,
    *,
    session_id: uuid.UUID | None = None,
    tree_id: uuid.UUID | None = None,
    limit: int = 500,
) -> list[Row]:
    cur = await conn.execute(
        _EVENTS_AFTER,
        {
            "user_id": scope.user_id,
            "app_id": scope.app_id,
            "after": after,
            "session_id": session_id,
            "tree_id": tree_id,
            "limit": limit,
        },
    )
    return await cur.fetchall()


async def session_updates_after(
    conn: Connection,
    scope: Scope,
    waiter: uuid.UUID,
    targets: list[uuid.UUID],
    after: int,
    limit: int = 100,
) -> list[Row]:
    """What ``wait_sessions`` counts as an update: terminal Turns, human waits, messages to the waiter."""
    cur = await conn.execute(
        _SESSION_UPDATES_AFTER,
        {
            "user_id": scope.user_id,
            "app_id": scope.app_id,
            "after": after,
            "targets": targets,
            "kinds": list(SESSION_UPDATE_KINDS),
            "waiter": waiter,
            "limit": limit,
        },
    )
    return await cur.fetchall()
