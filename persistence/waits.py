"""Parked Turns: a wait persists its condition and deadline, releases the slot, and is
resumed exactly once by a new Run of the same Turn when the condition holds or the
deadline passes. Evaluating a wait is idempotent, so any hint or sweep may try it.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from persistence import lifecycle
from persistence import runs as run_repo
from persistence.db import Connection, query
from persistence.errors import Conflict
from persistence.events import append_event, has_queued_update, session_updates_after
from persistence.records import Row, RunRef, Scope, new_id
from persistence.statuses import (
    RequestKind,
    RequestStatus,
    RunStatus,
    TurnStatus,
    WaitingFor,
    WaitKind,
    WaitStatus,
)
from persistence.turns import TOOL_RESULT_OUTPUT_CHARS, results_of_inputs, take_in

WAITING_FOR = {WaitKind.INPUTS: WaitingFor.COOPERATION, WaitKind.SESSIONS: WaitingFor.COOPERATION,
               WaitKind.APPROVAL: WaitingFor.APPROVAL, WaitKind.ANSWER: WaitingFor.ANSWER}
HUMAN_REQUEST_KIND = {WaitKind.APPROVAL: RequestKind.APPROVAL, WaitKind.ANSWER: RequestKind.QUESTION}

_WAIT = """
SELECT w.wait_id, w.session_id, w.tree_id, w.turn_id, w.run_id, w.tool_call_id, w.kind, w.condition,
       w.deadline, w.status, w.resumed_run_id, w.deadline <= now() AS expired, s.user_id, s.app_id
FROM waits w JOIN sessions s ON s.session_id = w.session_id
WHERE w.wait_id = %s
"""
_LOCK_WAIT = _WAIT + "FOR UPDATE OF w"


async def _lock_turn(conn: Connection, turn_id: uuid.UUID) -> Row | None:
    """The Turn's status, its row locked until the transaction ends: before its wait's, in the order
    every cancel takes them (``turns.cancel_turn``, ``trees.stop_tree``)."""
    cur = await conn.execute("SELECT status FROM turns WHERE turn_id = %s FOR NO KEY UPDATE", (turn_id,))
    return await cur.fetchone()


async def park(
    conn: Connection,
    run: RunRef,
    *,
    tool_call_id: str,
    kind: str,
    condition: dict[str, Any],
    timeout_seconds: float | None,
    targets: list[uuid.UUID] = (),  # type: ignore[assignment]
    request_payload: dict[str, Any] | None = None,
) -> uuid.UUID:
    """Interrupt the Run into a wait: the Turn goes ``waiting`` and the slot is released.

    A Turn that is being cancelled cannot wait (Conflict): the Turn row is locked first,
    so a cancel that commits meanwhile is seen here and never overwritten by ``waiting``.
    """
    await run_repo.fence(conn, run)
    turn = await _lock_turn(conn, run.turn_id)
    if turn is None or turn["status"] != TurnStatus.RUNNING:
        raise Conflict(f"turn {run.turn_id} is being cancelled; it cannot wait")
    wait_id = new_id()
    await conn.execute(
        """INSERT INTO waits (wait_id, session_id, tree_id, turn_id, run_id, tool_call_id, kind, condition,
                              deadline)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s,
                   CASE WHEN %s::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => %s) END)""",
        (wait_id, run.session_id, run.tree_id, run.turn_id, run.run_id, tool_call_id, kind, Jsonb(condition),
         timeout_seconds, timeout_seconds),
    )
    for target in dict.fromkeys(targets):
        await conn.execute("INSERT INTO wait_targets (wait_id, session_id) VALUES (%s, %s)", (wait_id, target))
    await run_repo.end_run(conn, run.run_id, RunStatus.INTERRUPTED)
    waiting_for = WAITING_FOR[kind]
    await conn.execute("UPDATE turns SET status = 'waiting', waiting_for = %s WHERE turn_id = %s",
                       (waiting_for, run.turn_id))
    if request_payload is not None:
        await conn.execute(
            """INSERT INTO requests (request_id, user_id, app_id, tree_id, session_id, turn_id, run_id, wait_id,
                                     kind, payload)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
            (new_id(), run.scope.user_id, run.scope.app_id, run.tree_id, run.session_id, run.turn_id, run.run_id,
             wait_id, HUMAN_REQUEST_KIND[kind], Jsonb(request_payload)),
        )
        await append_event(conn, run.scope, f"waiting_{waiting_for}", session_id=run.session_id,
                           tree_id=run.tree_id, turn_id=run.turn_id, run_id=run.run_id, payload=request_payload)
    else:
        await append_event(conn, run.scope, "waiting_cooperation", session_id=run.session_id,
                           tree_id=run.tree_id, turn_id=run.turn_id, run_id=run.run_id,
                           payload={"kind": kind})
    return wait_id


async def _condition_met(conn: Connection, wait: Row) -> bool:
    scope = Scope(wait["user_id"], wait["app_id"])
    condition = wait["condition"]
    if wait["kind"] == WaitKind.INPUTS:
        ids = [uuid.UUID(i) for i in condition["input_ids"]]
        results = await results_of_inputs(conn, scope, ids, output_chars=0)
        return all(result["terminal"] for result in results)
    if wait["kind"] == WaitKind.SESSIONS:
        targets = [uuid.UUID(t) for t in condition["targets"]]
        if has_queued_update(conn, scope, wait["session_id"], targets):
            return True
        return bool(await session_updates_after(conn, scope, wait["session_id"], targets, condition["after_cursor"],
                                                limit=1))
    cur = await conn.execute("SELECT status FROM requests WHERE wait_id = %s", (wait["wait_id"],))
    request = await cur.fetchone()
    return request is not None and request["status"] == RequestStatus.ANSWERED


async def is_due(conn: Connection, wait_id: uuid.UUID) -> bool:
    """Whether ``try_resume`` would resume this wait now (it is open, and its condition holds or its
    deadline passed), as this transaction sees it; the wait is read, not locked."""
    cur = await conn.execute(_WAIT, (wait_id,))
    wait = await cur.fetchone()
    return wait is not None and wait["status"] == WaitStatus.OPEN \
        and bool(wait["expired"] or await _condition_met(conn, wait))


async def try_resume(conn: Connection, wait_id: uuid.UUID) -> Row | None:
    """Resume the wait's Turn in a new pending Run if its condition holds or its deadline passed.

    Exactly once: the wait row is locked, and ``runs.resumes_run_id`` is unique. Its Turn is locked
    first: a cancel of the Turn (or a stop of its tree) under way then sees the resume Run when this
    commits first, and cancels it with the Turn, instead of leaving it to run; and the two never
    deadlock (each takes the Turn, then the wait).
    """
    cur = await conn.execute("SELECT turn_id FROM waits WHERE wait_id = %s", (wait_id,))
    found = await cur.fetchone()
    if found is None:
        return None
    await _lock_turn(conn, found["turn_id"])
    cur = await conn.execute(_LOCK_WAIT, (wait_id,))
    wait = await cur.fetchone()
    if wait is None or wait["status"] != WaitStatus.OPEN:
        return None
    if not (wait["expired"] or await _condition_met(conn, wait)):
        return None
    run_id = await run_repo.insert_run(conn, wait["turn_id"], wait["session_id"], wait["tree_id"],
                                       resumes_run_id=wait["run_id"])
    await conn.execute("UPDATE wait_targets SET open = false WHERE wait_id = %s", (wait_id,))
    await conn.execute("UPDATE waits SET status = 'resumed', resumed_run_id = %s WHERE wait_id = %s",
                       (run_id, wait_id))
    await conn.execute(
        "UPDATE turns SET status = 'running', waiting_for = NULL WHERE turn_id = %s AND status = 'waiting'",
        (wait["turn_id"],),
    )
    lifecycle.log_at_commit(conn, "wait_resumed", tree_id=wait["tree_id"], session_id=wait["session_id"],
                            turn_id=wait["turn_id"], run_id=run_id, wait_id=wait_id)
    return {"tree_id": wait["tree_id"], "session_id": wait["session_id"], "run_id": run_id}


async def change_targets(conn: Connection, session_ids: list[uuid.UUID]) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Whom a change to these sessions concerns, in one statement: their trees, and the open
    waits that watch any of them (their waiters may now be due)."""
    cur = await conn.execute(query("change_targets"), {"ids": session_ids})
    row = await cur.fetchone()
    assert row is not None
    return row["tree_ids"], row["wait_ids"]


async def tree_change_targets(conn: Connection, tree_id: uuid.UUID) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """``change_targets`` of every member of the tree, in one statement."""
    cur = await conn.execute(query("change_targets_of_tree"), {"tree_id": tree_id})
    row = await cur.fetchone()
    assert row is not None
    return row["tree_ids"], row["wait_ids"]


# Where a sweep of the open waits starts over (every wait id is after it).
SWEEP_START = uuid.UUID(int=0)


async def waits_to_sweep(conn: Connection, after: uuid.UUID, limit: int = 1000) -> tuple[list[uuid.UUID], uuid.UUID]:
    """The open waits a sweep round re-evaluates, and where the next round goes on: each whose
    deadline passed, and the next ``limit`` of the others after ``after``, so that a wait whose hint
    was lost is reached within a few rounds however many others are open."""
    cur = await conn.execute(query("waits_to_sweep"), {"after": after, "limit": limit})
    found = await cur.fetchall()
    page = [row["wait_id"] for row in found if not row["expired"]]
    following = page[-1] if len(page) == limit else SWEEP_START
    return list(dict.fromkeys(row["wait_id"] for row in found)), following


async def resumed_wait(conn: Connection, turn_id: uuid.UUID) -> Row | None:
    """The Turn's latest resumed wait, whose outcome a resume Run delivers unless its call has a
    result already. Read by the Turn, not by the Run that resumed it: that Run may have been
    recovered before it began (an activation that died, a lease that ran out), and the Run that
    recovers it must still deliver the outcome, or the waiting call would run again."""
    cur = await conn.execute(
        """SELECT wait_id, tool_call_id, kind, condition, deadline FROM waits
           WHERE turn_id = %s AND status = 'resumed' ORDER BY created_at DESC LIMIT 1""",
        (turn_id,),
    )
    return await cur.fetchone()


async def wait_outcome(conn: Connection, scope: Scope, wait: Row, waiter: uuid.UUID,
                       reader: uuid.UUID) -> dict[str, Any]:
    """The tool result a resumed Run gives the model for the call that waited (not approvals:
    an approved or denied command call runs again and reads the decision itself). ``reader``, the
    resumed Turn, asks from now on if what it takes in came from a Turn that asks (turns.take_in)."""
    condition = wait["condition"]
    if wait["kind"] == WaitKind.INPUTS:
        results = await results_of_inputs(conn, scope, [uuid.UUID(i) for i in condition["input_ids"]],
                                          output_chars=TOOL_RESULT_OUTPUT_CHARS)
        await take_in(conn, reader, (result["turn_id"] for result in results))
        return {"results": results, "timed_out": not all(r["terminal"] for r in results)}
    if wait["kind"] == WaitKind.SESSIONS:
        updates = await session_updates_after(
            conn, scope, waiter, [uuid.UUID(t) for t in condition["targets"]], condition["after_cursor"]
        )
        await take_in(conn, reader, (update["turn_id"] for update in updates))
        cursor = updates[-1]["cursor"] if updates else condition["after_cursor"]
        return {"updates": updates, "cursor": cursor, "timed_out": not updates}
    cur = await conn.execute("SELECT response FROM requests WHERE wait_id = %s", (wait["wait_id"],))
    request = await cur.fetchone()
    answer = ((request or {}).get("response") or {}).get("answer")
    return {"answer": answer} if answer is not None else {"error": "no answer was given"}


async def approval_decision(conn: Connection, turn_id: uuid.UUID, tool_call_id: str) -> str | None:
    """What a human decided about one tool call: None (never asked), 'pending', 'approve' or 'deny'."""
    cur = await conn.execute(query("approval_state"), {"turn_id": turn_id, "call_id": tool_call_id})
    row = await cur.fetchone()
    if row is None:
        return None
    if row["request_status"] != RequestStatus.ANSWERED:
        return "pending"
    return str((row["response"] or {}).get("decision", "deny"))
