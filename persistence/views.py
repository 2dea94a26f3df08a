"""Scoped reads the HTTP API needs beyond what the actors use."""

from __future__ import annotations

import collections
import uuid

from persistence import trees
from persistence.db import Connection
from persistence.errors import NotFound
from persistence.events import events_after
from persistence.messages import reader_page
from persistence.records import Row, Scope
from persistence.sessions import STATE_JOINS, activity, get_session_row
from persistence.statuses import Activity, TurnStatus

_TREE = """
SELECT tree_id, project_id, slot_limit, stopped, archived, created_at FROM trees
WHERE tree_id = %s AND user_id = %s AND app_id = %s
"""

INPUT_PREVIEW = 500  # characters of an input's text in lists

_LATEST_CURSOR = "SELECT last_cursor FROM scopes WHERE user_id = %s AND app_id = %s"

# A page after a place in the queue order, read along the session's index (inputs_session).
_INPUTS = f"""
SELECT i.seq, i.input_id, i.session_id, i.status, left(i.text, {INPUT_PREVIEW}) AS text,
       char_length(i.text) > {INPUT_PREVIEW} AS truncated, i.origin, t.turn_id, i.created_at, i.ended_at
FROM inputs i LEFT JOIN turns t ON t.input_id = i.input_id
WHERE i.session_id = %(session_id)s AND i.user_id = %(user_id)s AND i.app_id = %(app_id)s AND i.seq > %(after)s
  AND (%(status)s::text IS NULL OR i.status = %(status)s)
ORDER BY i.seq
LIMIT %(limit)s
"""

# Members grouped by what their activity is derived from: a handful of rows per tree,
# whatever its size, and the activity itself comes from the one rule in persistence/sessions.py.
_MEMBER_STATES = f"""
SELECT s.tree_id, t.status AS turn_status, t.waiting_for, lr.status AS run_status, p.n > 0 AS pending_inputs,
       s.queue_paused, count(*) AS members
FROM sessions s {STATE_JOINS}
WHERE s.tree_id = ANY(%s) AND s.user_id = %s AND s.app_id = %s
GROUP BY 1, 2, 3, 4, 5, 6
"""

# What a tree's attention counts (SPEC §3 activities), and failed (the member's latest Turn failed).
ATTENTION_KINDS = (*(kind for kind in Activity if kind != Activity.IDLE), TurnStatus.FAILED)


async def require_tree(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> Row:
    """The tree, or NotFound when it is absent from this scope."""
    cur = await conn.execute(_TREE, (tree_id, scope.user_id, scope.app_id))
    tree = await cur.fetchone()
    if tree is None:
        raise NotFound(f"no tree {tree_id}")
    return tree


async def require_target(conn: Connection, scope: Scope, *, session_id: uuid.UUID | None = None,
                         tree_id: uuid.UUID | None = None) -> Row:
    """The session or the tree (exactly one is given), or NotFound when it is absent from this scope."""
    if (session_id is None) == (tree_id is None):
        raise ValueError("give exactly one of session_id and tree_id")
    if session_id is not None:
        return await get_session_row(conn, scope, session_id)
    assert tree_id is not None
    return await require_tree(conn, scope, tree_id)


async def stream_finished(conn: Connection, scope: Scope, *, after: int, session_id: uuid.UUID | None = None,
                          tree_id: uuid.UUID | None = None, target: Row | None = None) -> bool:
    """Whether an event stream of the session or tree, at cursor ``after``, has nothing left to
    wait for: its tree is archived (it takes no input and cannot be stopped, so nothing more runs
    in it) and no event of it follows ``after``. One kind may still come: a change of its budget,
    which governs the trees it spawned; a stream that ended does not wait for one (the tree's
    summary shows the budget), a reconnect from its cursor gets it. The flag is read first: an
    event committed before it, the archive's own among them, is then seen by the read of the
    events. ``target``: the session or tree as ``require_target`` just read it in this transaction
    (else it is read here). NotFound when absent from this scope."""
    target = target or await require_target(conn, scope, session_id=session_id, tree_id=tree_id)
    if not target["archived"]:
        return False
    return not await events_after(conn, scope, after, session_id=session_id, tree_id=tree_id, limit=1)


async def session_messages(conn: Connection, scope: Scope, session_id: uuid.UUID, *, after_id: int, limit: int,
                           max_bytes: int) -> tuple[list[Row], bool]:
    """A page of a session's history, oldest first, and whether more follow (``messages.reader_page``),
    after checking the session is in the scope."""
    await get_session_row(conn, scope, session_id)
    return await reader_page(conn, session_id, after_id=after_id, limit=limit, max_bytes=max_bytes)


async def pending_requests(conn: Connection, scope: Scope, session_id: uuid.UUID) -> list[Row]:
    """The pending approvals and questions of a session, whole, oldest first (a tree's inbox:
    ``request_summaries``)."""
    await require_target(conn, scope, session_id=session_id)
    return await trees.pending_requests(conn, scope, session_id)


async def request_summaries(conn: Connection, scope: Scope, tree_id: uuid.UUID, *, after: uuid.UUID | None = None,
                            limit: int = trees.INBOX_LIMIT) -> tuple[list[Row], bool]:
    """The tree's inbox: a page of its pending requests, oldest first, long payload fields cut
    (``trees.request_summaries``), and whether more follow."""
    await require_target(conn, scope, tree_id=tree_id)
    return await trees.request_summaries(conn, scope, tree_id, after=after, limit=limit)


async def latest_cursor(conn: Connection, scope: Scope) -> int:
    """The scope's latest committed event cursor (0 before its first event).

    Cursors are assigned under the scope's counter lock until commit (persistence/events.py),
    so every event committed after this read has a larger cursor: state read after it and a
    stream resumed after it together miss nothing.
    """
    cur = await conn.execute(_LATEST_CURSOR, (scope.user_id, scope.app_id))
    row = await cur.fetchone()
    return int(row["last_cursor"]) if row else 0


async def session_inputs(conn: Connection, scope: Scope, session_id: uuid.UUID, *, status: str | None = None,
                         after: int = 0, limit: int = 100) -> tuple[list[Row], bool]:
    """A page of a session's inputs in queue order (FIFO) after the place ``after`` (an input's
    ``seq``), texts cut to a preview, after checking the scope; and whether more follow."""
    await get_session_row(conn, scope, session_id)
    cur = await conn.execute(_INPUTS, {"session_id": session_id, "user_id": scope.user_id, "app_id": scope.app_id,
                                       "status": status, "after": after, "limit": limit + 1})
    rows = await cur.fetchall()
    return rows[:limit], len(rows) > limit


async def tree_attention(conn: Connection, scope: Scope, tree_ids: list[uuid.UUID]) -> dict[uuid.UUID, Row]:
    """Per tree: its member count and how many members are in each ATTENTION_KINDS state.

    One statement for any number of trees (a list of roots never means a query per root).
    """
    counts: dict[uuid.UUID, collections.Counter[str]] = {tree_id: collections.Counter() for tree_id in tree_ids}
    cur = await conn.execute(_MEMBER_STATES, (tree_ids, scope.user_id, scope.app_id))
    for group in await cur.fetchall():
        tally = counts[group["tree_id"]]
        tally["members"] += group["members"]
        tally[activity(group)] += group["members"]
        if group["turn_status"] == TurnStatus.FAILED:
            tally[TurnStatus.FAILED] += group["members"]
    return {tree_id: {"members": tally["members"], **{kind: tally[kind] for kind in ATTENTION_KINDS}}
            for tree_id, tally in counts.items()}
