"""Whole-tree operations: stop all (by a human, or because a budget was reached), continue, archive,
the summary, and the human inbox."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from persistence import schedules, usage
from persistence.db import Connection
from persistence.errors import Conflict, InvalidArgument, NotFound
from persistence.events import append_event
from persistence.records import Row, Scope
from persistence.sessions import get_session_row, tree_members
from persistence.statuses import Activity, RequestKind, RequestStatus, TurnStatus
from persistence.turns import cancel_open_turn, lock_session, start_next_turn, turn_status

# NO KEY UPDATE, as every lock of a tree row: it serialises the tree's grants, stops, continues and
# budget changes, and lets a member's step create a session (whose foreign key shares the row) while
# a stop, holding the row, waits for that member's own row: FOR UPDATE made that a deadlock.
_LOCK_TREE = """
SELECT tree_id, slot_limit, stopped, stop_reason, archived FROM trees
WHERE tree_id = %s AND user_id = %s AND app_id = %s FOR NO KEY UPDATE
"""
# Stopped: the moment every member is locked, just before the commit (clock_timestamp, not the
# transaction's start), so that a model call that starts after the stop is seen to start after it.
_STOP = """
UPDATE trees SET stopped = true, stopped_at = clock_timestamp(), stop_reason = %(reason)s, stop_detail = %(detail)s
WHERE tree_id = %(tree_id)s
"""
_OPEN_TURNS = """
SELECT t.turn_id, t.status, t.waiting_for, t.session_id FROM turns t JOIN sessions s ON s.session_id = t.session_id
WHERE s.tree_id = %s AND t.status IN ('running', 'waiting', 'cancelling')
ORDER BY s.depth, s.path
FOR NO KEY UPDATE OF t
"""
_LOCK_MEMBERS = "SELECT session_id FROM sessions WHERE tree_id = %s ORDER BY session_id FOR NO KEY UPDATE"
_MEMBERS_WITH_PENDING = """
SELECT DISTINCT i.session_id FROM inputs i JOIN sessions s ON s.session_id = i.session_id
WHERE s.tree_id = %s AND i.status = 'pending'
"""
_REQUESTS = """
SELECT r.request_id AS id, r.kind, r.session_id, s.path, r.turn_id, r.payload, r.status, r.created_at
FROM requests r JOIN sessions s ON s.session_id = r.session_id
WHERE r.user_id = %(user_id)s AND r.app_id = %(app_id)s AND r.status = 'pending' AND r.session_id = %(session_id)s
ORDER BY r.created_at
"""
# The tree's inbox: its pending requests, oldest first, each a summary. Every field of a payload
# whose text is longer than INBOX_PREVIEW characters (a command or a file's content may have 100,000,
# and a tree 1,000 members asking) is cut here, in the database, to its first INBOX_PREVIEW
# characters (a field that is not a string, to its JSON text's), with its whole length as
# ``<field>_chars``: the server never receives whole payloads, and the answer stays bounded.
# ``after``: a request of this tree; the page starts after it (in the same order).
INBOX_PREVIEW = 500
INBOX_LIMIT = 1000  # a tree's default member limit, and a member has at most one pending request
_REQUEST_SUMMARIES = f"""
SELECT r.request_id AS id, r.kind, r.session_id, s.path, r.turn_id, cut.payload, cut.truncated, r.status,
       r.created_at
FROM requests r JOIN sessions s ON s.session_id = r.session_id
CROSS JOIN LATERAL (
    SELECT coalesce(jsonb_object_agg(f.key, CASE WHEN f.long THEN to_jsonb(left(f.text, {INBOX_PREVIEW}))
                                                 ELSE f.value END), '{{}}')
           || coalesce(jsonb_object_agg(f.key || '_chars', length(f.text)) FILTER (WHERE f.long), '{{}}')
           AS payload,
           coalesce(bool_or(f.long), false) AS truncated
    FROM (SELECT e.key, e.value, t.text, length(t.text) > {INBOX_PREVIEW} AS long
          FROM jsonb_each(r.payload) AS e(key, value)
          CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(e.value) = 'string' THEN e.value #>> '{{}}'
                                          ELSE e.value::text END AS text) AS t) AS f
) AS cut
WHERE r.user_id = %(user_id)s AND r.app_id = %(app_id)s AND r.status = 'pending' AND r.tree_id = %(tree_id)s
  AND (%(after)s::uuid IS NULL OR (r.created_at, r.request_id) > (
        SELECT a.created_at, a.request_id FROM requests a WHERE a.request_id = %(after)s AND a.tree_id = %(tree_id)s))
ORDER BY r.created_at, r.request_id
LIMIT %(limit)s
"""


async def lock_tree(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> Row:
    cur = await conn.execute(_LOCK_TREE, (tree_id, scope.user_id, scope.app_id))
    tree = await cur.fetchone()
    if tree is None:
        raise NotFound(f"no tree {tree_id}")
    return tree


async def stop_tree(conn: Connection, scope: Scope, tree_id: uuid.UUID, *,
                    reached: dict[str, Any] | None = None) -> list[uuid.UUID]:
    """Stop all: cancel every in-flight Turn and pause every queue with pending input; 409 for an
    archived tree.

    One transaction under the tree lock, so no later scan can re-pause a tree that was
    continued after it. ``reached``: the budget limit that stops it (``usage.budget_reached``);
    without it a human stopped it. Returns the sessions whose live Runs must be told to stop.
    """
    tree = await lock_tree(conn, scope, tree_id)
    if tree["archived"]:  # nothing in it runs or can: a stop would only add an event after its streams ended
        raise Conflict(f"tree {tree_id} is archived; nothing in it runs, so there is nothing to stop")
    # Lock every member before reading any Turn or appending any event: a member finishing
    # meanwhile is waited for (never cancelled over its result), and the scope's event
    # counter is taken last, so this cannot deadlock with a member's own transaction.
    await conn.execute(_LOCK_MEMBERS, (tree_id,))
    reason = "user" if reached is None else "budget_exceeded"
    await conn.execute(_STOP, {"tree_id": tree_id, "reason": reason,
                               "detail": None if reached is None else Jsonb(reached)})
    cur = await conn.execute(_MEMBERS_WITH_PENDING, (tree_id,))
    for row in await cur.fetchall():
        await conn.execute("UPDATE sessions SET queue_paused = true WHERE session_id = %s", (row["session_id"],))
    # Each open Turn locked, as a wait's resume locks it: one resumed meanwhile is read with its resume
    # Run (cancelled with it below), never cancelled with that Run left to run in the stopped tree.
    cur = await conn.execute(_OPEN_TURNS, (tree_id,))
    to_signal = []
    why = ("stopped: the whole tree was stopped" if reached is None
           else f"stopped: the tree's budget is used up ({usage.describe_reached(reached)})")
    for turn in await cur.fetchall():
        session = await lock_session(conn, scope, turn["session_id"])
        # A paused queue keeps its pending inputs: the Turn ends but no new one starts.
        session = {**session, "queue_paused": True}
        if await cancel_open_turn(conn, session, turn, why):
            to_signal.append(turn["session_id"])
    await append_event(conn, scope, "tree_stopped", session_id=tree_id, tree_id=tree_id,
                       payload={"reason": reason, **(reached or {})})
    return to_signal


async def stop_for_budget(conn: Connection, scope: Scope, tree_id: uuid.UUID, turn_id: uuid.UUID
                          ) -> list[uuid.UUID] | None:
    """A Run of the tree (of Turn ``turn_id``) found a budget limit reached: stop the tree as Stop
    all does, with the reason ``budget_exceeded`` and the limit. The limit is checked again under
    the tree's lock, so a budget raised (and the tree continued) meanwhile is never stopped by this
    late finding: None then, and the Run goes on. A tree another Run stopped for its budget
    already, with this Turn cancelled by it, is left as it is. Returns the sessions to signal."""
    tree = await lock_tree(conn, scope, tree_id)
    reached = await usage.budget_reached(conn, tree_id)
    if reached is None:
        return None
    if (tree["stopped"] and tree["stop_reason"] == "budget_exceeded"
            and await turn_status(conn, turn_id) != TurnStatus.RUNNING):
        return []
    return await stop_tree(conn, scope, tree_id, reached=reached)


async def continue_tree(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> list[uuid.UUID]:
    """Unpause every queue and start pending inputs. 409 while any Turn is unfinished, while a
    budget that covers the tree is used up, and for an archived tree."""
    tree = await lock_tree(conn, scope, tree_id)
    if tree["archived"]:
        raise Conflict(f"tree {tree_id} is archived; an archived tree cannot be continued")
    # Every member first, as Stop all does: an input being given to one (which pauses it while the
    # tree is stopped) commits before the unpause below reads which are paused.
    await conn.execute(_LOCK_MEMBERS, (tree_id,))
    cur = await conn.execute(_OPEN_TURNS, (tree_id,))
    unfinished = await cur.fetchall()
    if unfinished:
        raise Conflict(f"{len(unfinished)} turn(s) in this tree are still {unfinished[0]['status']}; "
                       "wait until they end before continuing")
    await usage.refuse_if_used_up(conn, tree_id, "continuing")
    await conn.execute("UPDATE trees SET stopped = false, stop_reason = NULL, stop_detail = NULL WHERE tree_id = %s",
                       (tree_id,))
    cur = await conn.execute(
        "UPDATE sessions SET queue_paused = false WHERE tree_id = %s AND queue_paused RETURNING session_id",
        (tree_id,),
    )
    unpaused = [row["session_id"] for row in await cur.fetchall()]
    started = []
    for session_id in unpaused:
        if await start_next_turn(conn, await lock_session(conn, scope, session_id)):
            started.append(session_id)
    await append_event(conn, scope, "tree_continued", session_id=tree_id, tree_id=tree_id)
    return started


async def archive_root(conn: Connection, scope: Scope, session_id: uuid.UUID) -> None:
    """Hide a finished tree from lists; deletes nothing, and ends its sessions' schedules (an archived
    tree takes no input). 409 while anything in it is busy."""
    # The tree lock first, then the session, in the same order as stop and continue.
    found = await get_session_row(conn, scope, session_id)
    if found["parent_id"] is not None:
        raise InvalidArgument("only a root session can be archived")
    if (await lock_tree(conn, scope, found["tree_id"]))["archived"]:
        return  # archived already: nothing more to hide or end
    # Every member, as Stop all does: an input being given to one (by a model of another tree, say)
    # commits before the members are read idle below, or waits and finds the tree archived.
    await conn.execute(_LOCK_MEMBERS, (found["tree_id"],))
    session = await lock_session(conn, scope, session_id)
    members = await tree_members(conn, scope, session["tree_id"])
    busy = [m for m in members if m["activity"] != Activity.IDLE]
    if busy:
        raise Conflict(f"{busy[0]['path']} is {busy[0]['activity']}; archive the tree when it is idle")
    # A stopped tree's paused queues look idle, but their inputs are work still to do (SPEC §7).
    queued = [m for m in members if m["pending_inputs"]]
    if queued:
        raise Conflict(f"{queued[0]['path']} has {queued[0]['pending_inputs']} pending input(s); cancel them or "
                       "continue the tree and let them finish before archiving it")
    requests, _ = await request_summaries(conn, scope, session["tree_id"], limit=1)  # the oldest, if any
    if requests:
        raise Conflict(f"{requests[0]['path']} has an open {requests[0]['kind']} request; answer it before "
                       "archiving the tree")
    cur = await conn.execute(
        "SELECT 1 FROM sandbox_leases WHERE tree_id = %s AND state = 'releasing'", (session["tree_id"],)
    )
    if await cur.fetchone():
        raise Conflict("the tree's sandbox is being cleaned up; try again shortly")
    await conn.execute("UPDATE trees SET archived = true WHERE tree_id = %s", (session["tree_id"],))
    await schedules.end_tree_schedules(conn, session["tree_id"])
    await conn.execute("UPDATE sessions SET archived = true, updated_at = now() WHERE tree_id = %s",
                       (session["tree_id"],))
    await append_event(conn, scope, "tree_archived", session_id=session_id, tree_id=session["tree_id"])


_MEMBER_FIELDS = ("session_id", "parent_id", "name", "path", "depth", "title", "activity", "turn_id",
                  "turn_status", "waiting_for", "pending_inputs", "queue_paused")


async def tree_summary(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> Row:
    """All members in two statements whatever the tree's size, and no output bodies: the tree's
    state, budget and usage with its members' usage (``usage.tree_head``), and the members' states."""
    # Two statements are two snapshots (read committed): the members are read first, so a summary
    # whose members are all settled has usage that includes all of their work (read the other way
    # round, a last reply and its Turn's end committed in between would be missing from the usage).
    found = await tree_members(conn, scope, tree_id)
    head = await usage.tree_head(conn, scope, tree_id)
    spent = head.pop("member_usage")
    members = [{**{field: member[field] for field in _MEMBER_FIELDS},
                "usage": spent.get(member["session_id"], usage.NO_USAGE)}
               for member in found]
    return {**head, "members": members}


async def pending_requests(conn: Connection, scope: Scope, session_id: uuid.UUID) -> list[Row]:
    cur = await conn.execute(_REQUESTS, {"user_id": scope.user_id, "app_id": scope.app_id, "session_id": session_id})
    return await cur.fetchall()


async def request_summaries(conn: Connection, scope: Scope, tree_id: uuid.UUID, *, after: uuid.UUID | None = None,
                            limit: int = INBOX_LIMIT) -> tuple[list[Row], bool]:
    """A page of the tree's pending requests, oldest first, long payload fields cut
    (``_REQUEST_SUMMARIES``), and whether more follow. An ``after`` that is no request of this tree
    gives an empty page."""
    cur = await conn.execute(_REQUEST_SUMMARIES, {"user_id": scope.user_id, "app_id": scope.app_id,
                                                  "tree_id": tree_id, "after": after, "limit": limit + 1})
    found = await cur.fetchall()
    return found[:limit], len(found) > limit


async def answer_request(conn: Connection, scope: Scope, request_id: uuid.UUID, response: dict[str, Any]
                         ) -> Row:
    """Record a human's approve/deny or answer; the wait it belongs to becomes due."""
    cur = await conn.execute(
        """SELECT request_id, kind, status, wait_id, session_id, tree_id, turn_id FROM requests
           WHERE request_id = %s AND user_id = %s AND app_id = %s FOR UPDATE""",
        (request_id, scope.user_id, scope.app_id),
    )
    request = await cur.fetchone()
    if request is None:
        raise NotFound(f"no request {request_id}")
    if request["status"] != RequestStatus.PENDING:
        raise Conflict(f"request {request_id} is already {request['status']}")
    if request["kind"] == RequestKind.APPROVAL:
        if response.get("decision") not in ("approve", "deny"):
            raise InvalidArgument("an approval is answered with decision 'approve' or 'deny'")
        response = {"decision": response["decision"]}
    else:
        answer = response.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise InvalidArgument("a question is answered with a non-empty 'answer'")
        response = {"answer": answer}
    await conn.execute(
        "UPDATE requests SET status = 'answered', response = %s, answered_at = now() WHERE request_id = %s",
        (Jsonb(response), request_id),
    )
    await append_event(conn, scope, "request_answered", session_id=request["session_id"],
                       tree_id=request["tree_id"], turn_id=request["turn_id"],
                       payload={"request_id": str(request_id), **response})
    return request
