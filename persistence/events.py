"""The event log: one cursor sequence per scope, never observed out of commit order.

The cursor comes from the scope's counter row, locked by the appending transaction
until it commits, so two appenders in one scope serialise and a reader that has seen
cursor N can never later see a smaller cursor appear. Inside ``Database.tx`` the events
are written last, just before the commit (``persistence.db.queued_last``), whatever point
of the transaction appended them, and all of one scope in one statement: the scope's lock
is then held for one round trip and the commit, and concurrent writers of one scope do
the rest of their work in parallel.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection
from typing import Any

from psycopg.types.json import Jsonb

from persistence import lifecycle
from persistence.db import Connection, queued_last
from persistence.records import Row, Scope

# The kinds a wait_sessions waiter treats as an update of a target session (the events_session_updates
# index holds these, schema.sql).
SESSION_UPDATE_KINDS = (
    "turn_completed",
    "turn_failed",
    "turn_cancelled",
    "waiting_approval",
    "waiting_answer",
    "coop_message",
)

# One statement for all the events a transaction appends in a scope: the scope's next
# cursors (locking its counter row until commit) and the events, numbered in order.
_APPEND_EVENTS = """
WITH counter AS (
    UPDATE scopes SET last_cursor = last_cursor + cardinality(%(kinds)s::text[])
    WHERE user_id = %(user_id)s AND app_id = %(app_id)s
    RETURNING last_cursor
)
INSERT INTO events (user_id, app_id, cursor, kind, session_id, tree_id, turn_id, run_id, payload)
SELECT %(user_id)s, %(app_id)s, counter.last_cursor - cardinality(%(kinds)s::text[]) + e.n,
       e.kind, e.session_id, e.tree_id, e.turn_id, e.run_id, e.payload
FROM counter,
     unnest(%(kinds)s::text[], %(session_ids)s::uuid[], %(tree_ids)s::uuid[], %(turn_ids)s::uuid[],
            %(run_ids)s::uuid[], %(payloads)s::jsonb[])
         WITH ORDINALITY AS e(kind, session_id, tree_id, turn_id, run_id, payload, n)
"""

# At most %(limit)s events, and none that begins past %(max_bytes)s bytes of the page's payloads
# (so the first always comes): a human wait's event holds what it asks whole (up to 100,000
# characters), and a page of 500 of them was 50 MB in the reader's memory. ``available``, how many of
# the first %(limit)s + 1 are there, tells whether another page follows.
_EVENTS_AFTER = """
WITH head AS (
    SELECT cursor, kind, session_id, tree_id, turn_id, run_id, payload, created_at,
           octet_length(payload::text) AS size
    FROM events
    WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND cursor > %(after)s {which}
    ORDER BY cursor
    LIMIT %(limit)s + 1
), sized AS (
    SELECT *, sum(size) OVER (ORDER BY cursor) - size AS before, row_number() OVER (ORDER BY cursor) AS n,
           count(*) OVER () AS available
    FROM head
)
SELECT cursor, kind, session_id, tree_id, turn_id, run_id, payload, created_at, available
FROM sized
WHERE n <= %(limit)s AND (%(max_bytes)s::bigint IS NULL OR before < %(max_bytes)s)
ORDER BY cursor
"""
# One statement per stream kind, not one with "IS NULL OR" filters: statements are prepared, and
# after a few tree streams PostgreSQL's generic plan for such a statement read a session's page
# through the scope's whole history (the primary key) instead of the session's index.
_EVENTS_OF = {
    "session": _EVENTS_AFTER.format(which="AND session_id = %(session_id)s "
                                          "AND (%(tree_id)s::uuid IS NULL OR tree_id = %(tree_id)s)"),
    "tree": _EVENTS_AFTER.format(which="AND tree_id = %(tree_id)s"),
    "scope": _EVENTS_AFTER.format(which=""),
}

# A human wait's payload holds what the session asks (a question, a command to approve: up to
# 100,000 characters each): the waiter is told of it with the start of each long text, so that an
# update of a hundred of them is not a tool result of megabytes.
_SESSION_UPDATES_AFTER = """
SELECT cursor, kind, e.session_id, turn_id, run_id, created_at,
       CASE WHEN kind IN ('waiting_approval', 'waiting_answer') THEN (
           SELECT jsonb_object_agg(key, CASE
               WHEN jsonb_typeof(value) = 'string' AND length(value #>> '{}') > 500
               THEN to_jsonb(left(value #>> '{}', 500) || format('... (%%s characters)', length(value #>> '{}')))
               ELSE value END)
           FROM jsonb_each(payload))
       ELSE payload END AS payload
FROM (SELECT DISTINCT unnest(%(targets)s::uuid[])) AS target (session_id)
CROSS JOIN LATERAL (
    SELECT * FROM events
    WHERE events.session_id = target.session_id AND kind IN (UPDATE_KINDS) AND cursor > %(after)s
      AND user_id = %(user_id)s AND app_id = %(app_id)s
      AND (kind <> 'coop_message' OR payload->>'receiver_session_id' = %(waiter)s::text)
    ORDER BY cursor
    LIMIT %(limit)s) e
ORDER BY cursor
LIMIT %(limit)s
""".replace("UPDATE_KINDS", ", ".join(f"'{kind}'" for kind in SESSION_UPDATE_KINDS))  # constants, written
# out: a prepared statement's generic plan cannot prove a parameter's kinds are the partial index's.
# Each target's updates are one ordered range of that index: asked for the first updates of all the
# targets at once, a planner could walk every event after the cursor, any session's, in cursor order.


@dataclasses.dataclass(frozen=True)
class _Event:
    kind: str
    session_id: uuid.UUID | None
    tree_id: uuid.UUID | None
    turn_id: uuid.UUID | None
    run_id: uuid.UUID | None
    payload: dict[str, Any]


class _ScopeEvents:
    """The events one transaction appends in one scope, written together just before its commit."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.events: list[_Event] = []

    async def run(self, conn: Connection) -> None:
        if self.events:
            await _write_events(conn, self.scope, self.events)

    def committed(self) -> None:
        lifecycle.on_events(self.events)  # their log lines and counters

    def mark(self) -> int:
        return len(self.events)

    def undo(self, mark: int) -> None:
        del self.events[mark:]


async def _write_events(conn: Connection, scope: Scope, events: list[_Event]) -> None:
    cur = await conn.execute(_APPEND_EVENTS, {
        "user_id": scope.user_id, "app_id": scope.app_id, "kinds": [e.kind for e in events],
        "session_ids": [e.session_id for e in events], "tree_ids": [e.tree_id for e in events],
        "turn_ids": [e.turn_id for e in events], "run_ids": [e.run_id for e in events],
        "payloads": [Jsonb(e.payload) for e in events]})
    assert cur.rowcount == len(events), "scope row missing: ensure_scope() first"


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
    event = _Event(kind, session_id, tree_id, turn_id, run_id, payload or {})
    queued = queued_last(conn)
    if queued is None:
        await _write_events(conn, scope, [event])
        lifecycle.on_events([event])
        return
    batch = next((s for s in queued if isinstance(s, _ScopeEvents) and s.scope == scope), None)
    if batch is None:
        batch = _ScopeEvents(scope)
        queued.append(batch)
    batch.events.append(event)


async def events_after(conn: Connection, scope: Scope, after: int, **page: Any) -> list[Row]:
    """``events_page``'s events alone."""
    rows, _ = await events_page(conn, scope, after, **page)
    return rows


async def events_page(
    conn: Connection,
    scope: Scope,
    after: int,
    *,
    session_id: uuid.UUID | None = None,
    tree_id: uuid.UUID | None = None,
    limit: int = 500,
    max_bytes: int | None = None,
) -> tuple[list[Row], bool]:
    """The events after the cursor ``after``, oldest first: at most ``limit``, and with
    ``max_bytes`` none that begins past that many bytes of payload; and whether more follow."""
    which = "session" if session_id is not None else "tree" if tree_id is not None else "scope"
    cur = await conn.execute(_EVENTS_OF[which], {
        "user_id": scope.user_id, "app_id": scope.app_id, "after": after, "session_id": session_id,
        "tree_id": tree_id, "limit": limit, "max_bytes": max_bytes})
    rows = await cur.fetchall()
    available = rows[0]["available"] if rows else 0
    for row in rows:
        del row["available"]
    return rows, available > len(rows)


def _is_update(event: _Event, waiter: uuid.UUID, targets: Collection[uuid.UUID]) -> bool:
    """``_SESSION_UPDATES_AFTER``'s rule, for an event not written yet."""
    return event.session_id in targets and event.kind in SESSION_UPDATE_KINDS \
        and (event.kind != "coop_message" or event.payload.get("receiver_session_id") == str(waiter))


def has_queued_update(conn: Connection, scope: Scope, waiter: uuid.UUID, targets: Collection[uuid.UUID]) -> bool:
    """Whether this transaction appended an update of ``targets`` for ``waiter`` that it writes only
    at its commit (``append_event``): after every cursor written before, so after any wait's."""
    return any(_is_update(event, waiter, targets)
               for batch in queued_last(conn) or () if isinstance(batch, _ScopeEvents) and batch.scope == scope
               for event in batch.events)


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
            "waiter": waiter,
            "limit": limit,
        },
    )
    return await cur.fetchall()
