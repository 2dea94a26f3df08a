"""Inputs, Turns and their terminal states: the Input → Turn → Run chain of one session.

A session consumes its inputs FIFO, one Turn at a time. A Turn is created the moment
its input reaches the head of an idle, unpaused queue, together with its first Run
(``pending``: queued for a slot).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from psycopg.types.json import Jsonb

from persistence import lifecycle, metrics, usage
from persistence import runs as run_repo
from persistence.db import Connection, query
from persistence.errors import Conflict, InvalidArgument, LeaseLost, LimitReached, NotFound, TurnCancelled
from persistence.events import append_event
from persistence.records import Row, RunRef, Scope, new_id
from persistence.settings import get_settings
from persistence.statuses import TERMINAL_TURN_STATUSES, InputStatus, RunStatus, TurnStatus, WaitingFor

MAX_TEXT = 100_000
_PREVIEW = 500
# The error of a Turn cancelled with no reason given (a cancel of exactly this Turn).
CANCELLED = "cancelled"
# A Turn whose Runs kept dying before they committed a reply (``runs.deaths_in_a_row``).
GIVEN_UP = "the turn's runs kept dying; giving up after repeated recoveries"

_LOCK_SESSION = """
SELECT session_id, tree_id, parent_id, path, user_id, app_id, queue_paused, archived
FROM sessions WHERE session_id = %s AND user_id = %s AND app_id = %s
FOR NO KEY UPDATE
"""
_OPEN_TURN = """
SELECT turn_id, status, waiting_for FROM turns
WHERE session_id = %s AND status IN ('running', 'waiting', 'cancelling')
"""
_NEXT_PENDING_INPUT = """
SELECT input_id, text, origin FROM inputs WHERE session_id = %s AND status = 'pending'
ORDER BY seq LIMIT 1 FOR UPDATE
"""
# A tool result carries at most this many characters of Turn outputs: a final reply may hold a
# million, and one wait_inputs result a hundred of them, each then sent again with every later model
# call of the waiting Turn. Each of n outputs gets up to 1/n of it; get_result's offset reads on.
TOOL_RESULT_OUTPUT_CHARS = 262_144
# output_keep NULL: the whole output (the API's results); else output_offset's next characters, and
# the whole output's length (0: neither, for a check that reads only whether results are terminal).
_RESULTS = """
SELECT i.session_id, i.input_id, i.status AS input_status, t.turn_id, t.status AS turn_status,
       t.result_run_id, coalesce(t.error, r.error) AS error,
       CASE WHEN %(output_keep)s::int IS NULL THEN r.output
            ELSE substr(r.output, %(output_offset)s::int + 1, %(output_keep)s::int) END AS output,
       CASE WHEN %(output_keep)s::int > 0 THEN length(r.output) END AS output_chars
FROM inputs i
LEFT JOIN turns t ON t.input_id = i.input_id
LEFT JOIN runs r ON r.run_id = t.result_run_id
WHERE i.user_id = %(user_id)s AND i.app_id = %(app_id)s
"""
_RESULT_BY_ID = _RESULTS + "AND (i.input_id = %(input_id)s OR t.turn_id = %(turn_id)s)"
_RESULTS_OF_INPUTS = _RESULTS + "AND i.input_id = ANY(%(ids)s)"


def check_text(text: str, what: str = "text") -> None:
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"{what} must be a non-empty string")
    if len(text) > MAX_TEXT:
        raise InvalidArgument(f"{what} holds {len(text)} characters; the limit is {MAX_TEXT}")


async def lock_session(conn: Connection, scope: Scope, session_id: uuid.UUID) -> Row:
    cur = await conn.execute(_LOCK_SESSION, (session_id, scope.user_id, scope.app_id))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no session {session_id}")
    return row


async def open_turn(conn: Connection, session_id: uuid.UUID) -> Row | None:
    cur = await conn.execute(_OPEN_TURN, (session_id,))
    return await cur.fetchone()


def _scope_of(session: Row) -> Scope:
    return Scope(session["user_id"], session["app_id"])


async def submit_input(
    conn: Connection, scope: Scope, session_id: uuid.UUID, text: str, origin: dict[str, Any],
) -> Row:
    """Queue an input FIFO; start its Turn at once when the session is idle.

    A human's input also unpauses that member's queue (after a stop, only that member), and is
    refused while a budget that covers the tree is used up (it could not run); one from
    outside the tree (a schedule, another tree's session) to a member of a stopped tree that is idle,
    or whose Turn the stop is still cancelling, pauses it.
    """
    check_text(text)
    session = await lock_session(conn, scope, session_id)
    if session["archived"]:
        raise Conflict(f"session {session_id} is archived")
    await _check_queue_room(conn, session)
    current = await open_turn(conn, session_id)
    if current and current["status"] == TurnStatus.WAITING and current["waiting_for"] in (WaitingFor.APPROVAL,
                                                                                WaitingFor.ANSWER):
        raise Conflict(
            f"session {session['path']} is waiting for a human {current['waiting_for']}; "
            "answer its request before giving it new work"
        )
    if origin.get("kind") == "human":
        await usage.refuse_if_used_up(conn, session["tree_id"], "giving it input")
        if session["queue_paused"]:
            await conn.execute("UPDATE sessions SET queue_paused = false WHERE session_id = %s", (session_id,))
            session = {**session, "queue_paused": False}
    elif (not session["queue_paused"] and (current is None or current["status"] == TurnStatus.CANCELLING)
          and not _from_within(origin, session) and await _tree_stopped(conn, session["tree_id"])):
        # Stop all paused every member with pending input; one given input later from outside the
        # tree (a schedule, another tree's session) while it is still stopped is paused the same way:
        # Continue, or a human's input, starts it. (Continue locks every member first: it waits for
        # this.) A member's own input is not: in a stopped tree only a human's input runs a member,
        # and what that member delegates within the tree is the human's work too.
        await conn.execute("UPDATE sessions SET queue_paused = true WHERE session_id = %s", (session_id,))
        session = {**session, "queue_paused": True}
    input_id = new_id()
    await conn.execute(
        """INSERT INTO inputs (input_id, session_id, user_id, app_id, text, origin)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (input_id, session_id, scope.user_id, scope.app_id, text, Jsonb(origin)),
    )
    await _input_received(conn, scope, session_id, session["tree_id"], input_id, origin)
    started = await start_next_turn(conn, session)
    turn_id = started["turn_id"] if started and started["input_id"] == input_id else None
    return {
        "input_id": input_id,
        "session_id": session_id,
        "status": "started" if turn_id else "queued",
        "turn_id": turn_id,
    }


async def _check_queue_room(conn: Connection, session: Row) -> None:
    """LimitReached when the session's queue holds ``max_pending_inputs`` (counted under its lock):
    a model that gives itself or another session work in a loop cannot grow a queue without bound."""
    limit = get_settings().max_pending_inputs
    cur = await conn.execute(query("inputs_pending_count"), {"session_id": session["session_id"], "limit": limit})
    row = await cur.fetchone()
    if row is not None and row["pending"] >= limit:
        raise LimitReached(f"session {session['path']} already has {limit} inputs waiting in its queue, the most it "
                           "may (CANOPY_MAX_PENDING_INPUTS): give it more once it has taken some")


def _from_within(origin: dict[str, Any], session: Row) -> bool:
    return origin.get("kind") == "session" and origin.get("tree_id") == str(session["tree_id"])


async def _tree_stopped(conn: Connection, tree_id: uuid.UUID) -> bool:
    cur = await conn.execute("SELECT stopped FROM trees WHERE tree_id = %s", (tree_id,))
    tree = await cur.fetchone()
    return bool(tree and tree["stopped"])


async def _input_received(conn: Connection, scope: Scope, session_id: uuid.UUID, tree_id: uuid.UUID,
                          input_id: uuid.UUID, origin: dict[str, Any]) -> None:
    await append_event(conn, scope, "input_received", session_id=session_id, tree_id=tree_id,
                       payload={"input_id": str(input_id), "origin": origin})


async def _turn_started(conn: Connection, scope: Scope, session_id: uuid.UUID, tree_id: uuid.UUID,
                        turn_id: uuid.UUID, run_id: uuid.UUID, input_id: uuid.UUID) -> None:
    await append_event(conn, scope, "turn_started", session_id=session_id, tree_id=tree_id, turn_id=turn_id,
                       run_id=run_id, payload={"input_id": str(input_id)})


async def submit_first_input(conn: Connection, scope: Scope, session_id: uuid.UUID, tree_id: uuid.UUID,
                             text: str, origin: dict[str, Any]) -> Row:
    """The first input of a session created in this transaction: its Turn starts at once.

    A new session has nothing queued or open and no other transaction sees it yet, so the
    checks and the session lock of ``submit_input`` have nothing to find: one statement
    writes the input, its Turn, the Turn's first Run and the first history message.
    """
    check_text(text)
    input_id, turn_id, run_id = new_id(), new_id(), new_id()
    await conn.execute(query("start_first_turn"), {
        "input_id": input_id, "turn_id": turn_id, "run_id": run_id, "session_id": session_id, "tree_id": tree_id,
        "user_id": scope.user_id, "app_id": scope.app_id, "text": text, "origin": Jsonb(origin)})
    await _input_received(conn, scope, session_id, tree_id, input_id, origin)
    await _turn_started(conn, scope, session_id, tree_id, turn_id, run_id, input_id)
    return {"input_id": input_id, "session_id": session_id, "status": "started", "turn_id": turn_id}


async def start_next_turn(conn: Connection, session: Row) -> Row | None:
    """Bind the oldest pending input to a new Turn and queue its first Run for a slot.

    The caller holds the session row lock.
    """
    if await open_turn(conn, session["session_id"]):
        return None
    return await _start_pending_input(conn, session)


async def _start_pending_input(conn: Connection, session: Row) -> Row | None:
    """``start_next_turn`` for a session known to have no open Turn (one just ended)."""
    if session["queue_paused"] or session["archived"]:
        return None
    cur = await conn.execute(_NEXT_PENDING_INPUT, (session["session_id"],))
    pending = await cur.fetchone()
    if pending is None:
        return None
    turn_id = new_id()
    await conn.execute("UPDATE inputs SET status = 'consumed' WHERE input_id = %s", (pending["input_id"],))
    await conn.execute(query("turn_insert"),
                       {"turn_id": turn_id, "session_id": session["session_id"], "input_id": pending["input_id"]})
    run_id = await run_repo.insert_run(conn, turn_id, session["session_id"], session["tree_id"])
    await conn.execute(
        """INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, origin)
           VALUES (%s, %s, %s, 'user', %s, %s)""",
        (session["session_id"], turn_id, run_id, pending["text"], Jsonb(pending["origin"])),
    )
    await _turn_started(conn, _scope_of(session), session["session_id"], session["tree_id"], turn_id, run_id,
                        pending["input_id"])
    return {"turn_id": turn_id, "run_id": run_id, "input_id": pending["input_id"]}


async def _end_turn(conn: Connection, session: Row, turn_id: uuid.UUID, result_run_id: uuid.UUID,
                    status: str, output: str | None, error: str | None) -> Row | None:
    """Terminal state, result Run and event in one go; then the next input may start."""
    cur = await conn.execute(
        """UPDATE turns SET status = %s, waiting_for = NULL, result_run_id = %s, ended_at = now(), error = %s
           WHERE turn_id = %s RETURNING input_id""",
        (status, result_run_id, error, turn_id),
    )
    turn = await cur.fetchone()
    assert turn is not None
    payload = {"input_id": str(turn["input_id"]), "status": status, "error": error,
               "output_preview": (output or "")[:_PREVIEW]}
    await append_event(conn, _scope_of(session), f"turn_{status}", session_id=session["session_id"],
                       tree_id=session["tree_id"], turn_id=turn_id, run_id=result_run_id, payload=payload)
    return await _start_pending_input(conn, session)  # a session has one open Turn: this one


async def finish_turn(conn: Connection, run: RunRef, status: str, *, output: str | None = None,
                      error: str | None = None, locked_session: Row | None = None) -> Row | None:
    """The executing Run ends its Turn (completed, failed or cancelled); fenced by its lease.
    ``locked_session``: the session's row when the caller has taken ``lock_session`` already.
    Cancelled with no error of the Run's own, the Turn was cancelled by someone else while it ran:
    its error is the reason that cancel gave (a user, Stop all, a budget), as for a Turn a cancel
    ends itself."""
    if status not in TERMINAL_TURN_STATUSES:
        raise ValueError(status)
    session = locked_session or await lock_session(conn, run.scope, run.session_id)
    if status == TurnStatus.CANCELLED and error is None:
        error = await cancel_reason(conn, run.session_id, run.turn_id)
    await run_repo.end_own_run(conn, run, status, output=output, error=error)
    return await _end_turn(conn, session, run.turn_id, run.run_id, status, output, error)


async def begin_tool_step(conn: Connection, run: RunRef) -> str:
    """The first statements of a step that runs tool calls (see tool_step_lock.sql): the Run is
    fenced (LeaseLost) and its session locked until the step commits; a Turn that is being
    cancelled runs nothing more (TurnCancelled). Returns the Turn's approval mode."""
    cur = await conn.execute(query("tool_step_lock"), {"run_id": run.run_id, "owner": run.owner,
                                                      "session_id": run.session_id})
    lock = await cur.fetchone()
    if lock is None or not lock["fenced"]:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")
    cur = await conn.execute(query("turn_state"), {"turn_id": run.turn_id})
    turn = await cur.fetchone()
    if turn is None or turn["status"] != TurnStatus.RUNNING:
        raise TurnCancelled(f"turn {run.turn_id} is being cancelled; no further tool call runs")
    return str(turn["approval_mode"])


async def take_in(conn: Connection, turn_id: uuid.UUID, sources: Iterable[uuid.UUID | None]) -> None:
    """The Turn ``turn_id`` reads what the Turns ``sources`` produced (their results, their updates):
    if one of them asks, so does this Turn from now on. Context from an ask Turn must not get a
    command run unasked through an auto one, whether it came as a message (persistence/messages.py)
    or as an answer to a wait or a read."""
    ids = [source for source in sources if source is not None]
    if ids:
        await conn.execute(query("turn_ask_if_any_asks"), {"turn_id": turn_id, "sources": ids})


async def turn_status(conn: Connection, turn_id: uuid.UUID) -> str | None:
    cur = await conn.execute(query("turn_state"), {"turn_id": turn_id})
    turn = await cur.fetchone()
    return None if turn is None else str(turn["status"])


async def turn_times(conn: Connection, turn_id: uuid.UUID) -> Row:
    """When the Turn started and ended (``ended_at`` None while it is open)."""
    cur = await conn.execute(query("turn_times"), {"turn_id": turn_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no turn {turn_id}")
    return row


async def cancel_open_turn(conn: Connection, session: Row, turn: Row, reason: str) -> bool:
    """Cancel a non-terminal Turn. Returns True when a live Run must still be told to stop.

    A Turn whose Run executes goes to ``cancelling``: its owner cancels itself at once
    (signal) or at its next model boundary, and a dead owner's expired lease finalises
    it. A Turn with no executing Run (queued for a slot, or waiting) is cancelled here.
    """
    cur = await conn.execute(
        "SELECT run_id, status FROM runs WHERE turn_id = %s ORDER BY queued_at DESC LIMIT 1",
        (turn["turn_id"],),
    )
    latest = await cur.fetchone()
    assert latest is not None
    if latest["status"] == RunStatus.RUNNING:
        if turn["status"] != TurnStatus.CANCELLING:
            await conn.execute("UPDATE turns SET status = 'cancelling', waiting_for = NULL WHERE turn_id = %s",
                               (turn["turn_id"],))
            await append_event(conn, _scope_of(session), "turn_cancelling", session_id=session["session_id"],
                               tree_id=session["tree_id"], turn_id=turn["turn_id"], run_id=latest["run_id"],
                               payload={"reason": reason})
        return True
    await finalize_cancel(conn, session, turn["turn_id"], latest["run_id"], reason)
    return False


async def cancel_reason(conn: Connection, session_id: uuid.UUID, turn_id: uuid.UUID) -> str:
    """The reason the cancel of a Turn that was running gave (``cancel_open_turn``)."""
    cur = await conn.execute(query("turn_cancel_reason"), {"session_id": session_id, "turn_id": turn_id})
    found = await cur.fetchone()
    return found["reason"] if found is not None and found["reason"] else CANCELLED


async def finalize_cancel(conn: Connection, session: Row, turn_id: uuid.UUID, result_run_id: uuid.UUID,
                          reason: str) -> Row | None:
    await conn.execute(
        """UPDATE runs SET status = 'cancelled', ended_at = clock_timestamp(), lease_expires_at = NULL,
                  error = coalesce(error, %s)
           WHERE turn_id = %s AND status IN ('pending', 'running')""",
        (reason, turn_id),
    )
    await conn.execute("WITH closed AS (UPDATE waits SET status = 'cancelled' WHERE turn_id = %s AND status = 'open' "
                       "RETURNING wait_id) UPDATE wait_targets SET open = false WHERE wait_id IN (SELECT wait_id "
                       "FROM closed)", (turn_id,))
    await conn.execute(
        "UPDATE requests SET status = 'cancelled' WHERE turn_id = %s AND status = 'pending'", (turn_id,)
    )
    return await _end_turn(conn, session, turn_id, result_run_id, TurnStatus.CANCELLED, None, reason)


async def cancel_turn(conn: Connection, scope: Scope, session_id: uuid.UUID, turn_id: uuid.UUID,
                      reason: str = CANCELLED) -> bool | None:
    """Cancel exactly this Turn (history and side effects stay). True: a live Run must be signalled;
    None: the Turn had ended already, and nothing was written."""
    session = await lock_session(conn, scope, session_id)
    cur = await conn.execute(
        # NO KEY UPDATE: a tool call of this Turn committing meanwhile only needs a key-share lock on it
        # (its receipt's foreign key) and must not deadlock with the cancel.
        "SELECT turn_id, status, waiting_for FROM turns WHERE turn_id = %s AND session_id = %s FOR NO KEY UPDATE",
        (turn_id, session_id),
    )
    turn = await cur.fetchone()
    if turn is None:
        raise NotFound(f"no turn {turn_id} in session {session_id}")
    if turn["status"] in TERMINAL_TURN_STATUSES:
        return None
    return await cancel_open_turn(conn, session, turn, reason)


async def cancel_input(conn: Connection, scope: Scope, input_id: uuid.UUID) -> Row:
    """Cancel a queued input that has no Turn yet; its waiters see it terminal."""
    cur = await conn.execute(
        "SELECT input_id, session_id, status FROM inputs WHERE input_id = %s AND user_id = %s AND app_id = %s",
        (input_id, scope.user_id, scope.app_id),
    )
    found = await cur.fetchone()
    if found is None:
        raise NotFound(f"no input {input_id}")
    session = await lock_session(conn, scope, found["session_id"])
    cur = await conn.execute("SELECT status FROM inputs WHERE input_id = %s FOR UPDATE", (input_id,))
    current = await cur.fetchone()
    assert current is not None
    if current["status"] == InputStatus.CONSUMED:
        raise Conflict(f"input {input_id} already has a turn; cancel the turn instead")
    if current["status"] == InputStatus.PENDING:
        await conn.execute(
            "UPDATE inputs SET status = 'cancelled', ended_at = now() WHERE input_id = %s", (input_id,)
        )
        await append_event(conn, scope, "input_cancelled", session_id=session["session_id"],
                           tree_id=session["tree_id"], payload={"input_id": str(input_id)})
    return {"input_id": input_id, "session_id": session["session_id"], "status": InputStatus.CANCELLED}


def _result(row: Row, offset: int = 0) -> Row:
    status = row["turn_status"] or row["input_status"]
    terminal = row["turn_status"] in TERMINAL_TURN_STATUSES or row["input_status"] == InputStatus.CANCELLED
    result = {
        "session_id": row["session_id"],
        "input_id": row["input_id"],
        "input_status": row["input_status"],
        "turn_id": row["turn_id"],
        "status": status,
        "terminal": terminal,
        "result_run_id": row["result_run_id"],
        "output": row["output"],
        "error": row["error"] if row["turn_status"] != TurnStatus.COMPLETED else None,
    }
    read_to = offset + len(row["output"] or "")
    if row["output_chars"] is not None and read_to < row["output_chars"]:  # cut for a tool result
        result.update(output_chars=row["output_chars"], output_next_offset=read_to)
    return result


def _output_window(output_chars: int | None, offset: int = 0) -> dict[str, int | None]:
    return {"output_keep": output_chars, "output_offset": offset}


async def get_result(conn: Connection, scope: Scope, *, input_id: uuid.UUID | None = None,
                     turn_id: uuid.UUID | None = None, output_chars: int | None = None, offset: int = 0) -> Row:
    """The exact result of one Input or Turn: the output of its ``result_run_id``; with
    ``output_chars``, at most that many of its characters from ``offset`` on (a tool result's)."""
    if (input_id is None) == (turn_id is None):
        raise InvalidArgument("give exactly one of input_id and turn_id")
    cur = await conn.execute(_RESULT_BY_ID, {"user_id": scope.user_id, "app_id": scope.app_id,
                                             "input_id": input_id, "turn_id": turn_id,
                                             **_output_window(output_chars, offset)})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no {'input' if input_id else 'turn'} {input_id or turn_id}")
    return _result(row, offset)


async def results_of_inputs(conn: Connection, scope: Scope, input_ids: list[uuid.UUID], *,
                            output_chars: int | None = None) -> list[Row]:
    """The results of these Inputs, in their order; with ``output_chars``, at most that many
    characters of their outputs in all, an equal share each (0: none)."""
    share = None if output_chars is None else output_chars // max(len(input_ids), 1)
    cur = await conn.execute(
        _RESULTS_OF_INPUTS,
        {"user_id": scope.user_id, "app_id": scope.app_id, "ids": input_ids, **_output_window(share)},
    )
    by_id = {row["input_id"]: _result(row) for row in await cur.fetchall()}
    return [by_id[input_id] for input_id in input_ids if input_id in by_id]


async def recover_expired_run(conn: Connection, run_id: uuid.UUID) -> Row | None:
    """A Run whose owner stopped heart-beating: interrupt it and resume its Turn in a new Run.

    A Turn that was being cancelled is finalised as cancelled instead; a Turn whose Runs keep
    dying before they commit a reply is failed (``runs.deaths_in_a_row``). Returns the affected
    tree, or None when nothing was due.
    """
    cur = await conn.execute(
        "SELECT s.session_id, s.user_id, s.app_id FROM runs r JOIN sessions s USING (session_id) WHERE r.run_id = %s",
        (run_id,))
    owner_session = await cur.fetchone()
    if owner_session is None:
        return None
    scope = Scope(owner_session["user_id"], owner_session["app_id"])
    # Session before run, the same order as finish_turn, so the two never deadlock.
    session = await lock_session(conn, scope, owner_session["session_id"])
    expired = await run_repo.lock_expired_run(conn, run_id)
    if expired is None:
        return None
    await run_repo.end_run(conn, run_id, RunStatus.INTERRUPTED, error=run_repo.LEASE_EXPIRED)
    metrics.count_at_commit(conn, metrics.RECOVERIES)
    lifecycle.log_at_commit(conn, "run_interrupted", tree_id=expired["tree_id"], session_id=expired["session_id"],
                            turn_id=expired["turn_id"], run_id=run_id, reason="lease_expired")
    if expired["turn_status"] == TurnStatus.CANCELLING:
        await finalize_cancel(conn, session, expired["turn_id"], run_id,
                              await cancel_reason(conn, session["session_id"], expired["turn_id"]))
    elif await run_repo.deaths_in_a_row(conn, expired["turn_id"]) >= run_repo.MAX_RECOVERIES_PER_TURN:
        await conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = %s", (run_id,))
        await _end_turn(conn, session, expired["turn_id"], run_id, TurnStatus.FAILED, None, GIVEN_UP)
    else:
        await run_repo.insert_run(conn, expired["turn_id"], expired["session_id"], expired["tree_id"],
                                  resumes_run_id=run_id)
        await append_event(conn, scope, "run_recovered", session_id=expired["session_id"],
                           tree_id=expired["tree_id"], turn_id=expired["turn_id"], run_id=run_id)
    return {"tree_id": expired["tree_id"], "session_id": expired["session_id"]}
