"""Inputs and Turns: FIFO, one Turn at a time, exact results, cancel of exactly one Turn or input."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from persistence import receipts, turns
from persistence.db import Database, query
from persistence.errors import Conflict, InvalidArgument, NotFound
from persistence.records import Row, Scope
from tests.persistence.helpers import (
    HUMAN,
    PLANNED_AT_SCALE,
    ExplainingConnection,
    GenericPlanExplainingConnection,
    child_run,
    claim_turn,
    count_rows,
    fetch_all,
    fetch_one,
    finish,
    latest_run_id,
    make_tree,
    rows_read,
    run_row,
    start_root_run,
    start_run,
    submit,
    turn_row,
)


async def result(db: Database, scope: Scope, **ids: uuid.UUID | str) -> Row:
    async with db.tx() as conn:
        return await turns.get_result(conn, scope, **{k: uuid.UUID(str(v)) for k, v in ids.items()})


async def test_result_of_task_a_stays_exact_after_task_b(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    a, run_a = await start_run(db, scope, tree.tree_id, tree.root_id, "task A")
    b = await submit(db, scope, tree.root_id, "task B")
    assert b["status"] == "queued" and b["turn_id"] is None
    assert (await result(db, scope, input_id=b["input_id"]))["status"] == "pending"

    next_turn = await finish(db, run_a, output="output of A")
    assert next_turn is not None and next_turn["input_id"] == b["input_id"]  # B starts as A ends
    run_b = await claim_turn(db, tree.tree_id, next_turn["turn_id"])
    during_b = await result(db, scope, input_id=a["input_id"])
    await finish(db, run_b, output="output of B")

    for got in (during_b, await result(db, scope, input_id=a["input_id"]),
                await result(db, scope, turn_id=a["turn_id"])):
        assert got["output"] == "output of A"
        assert got["result_run_id"] == run_a.run_id
        assert got["turn_id"] == uuid.UUID(str(a["turn_id"])) and got["status"] == "completed"
        assert got["terminal"] is True and got["error"] is None and got["input_status"] == "consumed"
    got_b = await result(db, scope, input_id=b["input_id"])
    assert (got_b["output"], got_b["result_run_id"]) == ("output of B", run_b.run_id)
    stored = await fetch_one(db, "SELECT result_run_id FROM turns WHERE turn_id = %s", (run_a.turn_id,))
    assert stored["result_run_id"] == run_a.run_id


async def test_inputs_are_consumed_fifo_one_turn_at_a_time(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    queued = [await submit(db, scope, tree.root_id, f"task {n}") for n in range(3)]
    assert [q["status"] for q in queued] == ["queued"] * 3
    order = []
    for _ in queued:
        started = await finish(db, run)
        assert started is not None
        order.append(started["input_id"])
        run = await claim_turn(db, tree.tree_id, started["turn_id"])
    assert order == [q["input_id"] for q in queued]
    assert await finish(db, run) is None  # nothing left
    rows = await fetch_all(db, "SELECT status FROM turns WHERE session_id = %s", (tree.root_id,))
    assert sorted(r["status"] for r in rows) == ["completed"] * 4
    history = await fetch_all(db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'user' "
                                  "ORDER BY id", (tree.root_id,))
    assert [h["content"] for h in history] == ["task", "task 0", "task 1", "task 2"]


async def test_a_failed_turn_keeps_its_error_as_its_result(db: Database, scope: Scope) -> None:
    _tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await turns.finish_turn(conn, run, "failed", error="provider exploded")
    got = await result(db, scope, turn_id=run.turn_id)
    assert (got["status"], got["terminal"], got["error"], got["result_run_id"]) == \
        ("failed", True, "provider exploded", run.run_id)


async def test_get_result_needs_exactly_one_id(db: Database, scope: Scope) -> None:
    async with db.tx() as conn:
        with pytest.raises(InvalidArgument):
            await turns.get_result(conn, scope)
        with pytest.raises(InvalidArgument):
            await turns.get_result(conn, scope, input_id=uuid.uuid4(), turn_id=uuid.uuid4())
        with pytest.raises(NotFound):
            await turns.get_result(conn, scope, input_id=uuid.uuid4())


@pytest.mark.parametrize("text", ["", "   ", "x" * 100_001])
async def test_bad_text_is_refused_with_nothing_stored(db: Database, scope: Scope, text: str) -> None:
    tree = await make_tree(db, scope)
    before = await count_rows(db)
    with pytest.raises(InvalidArgument):
        await submit(db, scope, tree.root_id, text)
    assert await count_rows(db) == before


async def test_cancel_input_of_a_pending_input(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    queued = await submit(db, scope, tree.root_id, "later")
    async with db.tx() as conn:
        cancelled = await turns.cancel_input(conn, scope, queued["input_id"])
    assert cancelled["status"] == "cancelled"
    row = await fetch_one(db, "SELECT status, ended_at FROM inputs WHERE input_id = %s", (queued["input_id"],))
    assert row["status"] == "cancelled" and row["ended_at"] is not None
    got = await result(db, scope, input_id=queued["input_id"])
    assert (got["status"], got["terminal"], got["turn_id"]) == ("cancelled", True, None)
    assert await finish(db, run) is None  # the cancelled input never gets a Turn
    assert len(await fetch_all(db, "SELECT turn_id FROM turns WHERE session_id = %s", (tree.root_id,))) == 1

    before = await count_rows(db)
    with pytest.raises(Conflict, match="already has a turn"):
        async with db.tx() as conn:
            await turns.cancel_input(conn, scope, (await turn_row(db, run.turn_id))["input_id"])
    assert await count_rows(db) == before


async def test_cancel_a_queued_turn_ends_it_at_once(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    receipt = await submit(db, scope, tree.root_id)  # its Run waits for a slot
    async with db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, tree.root_id, receipt["turn_id"]) is False
    turn = await turn_row(db, receipt["turn_id"])
    assert turn["status"] == "cancelled" and turn["ended_at"] is not None
    assert (await run_row(db, await latest_run_id(db, receipt["turn_id"])))["status"] == "cancelled"


async def test_cancel_a_running_turn_goes_through_cancelling(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    child, child_run_ref = await child_run(db, run, "aaa")
    async with db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id) is True
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id) is True  # idempotent
    assert (await turn_row(db, run.turn_id))["status"] == "cancelling"
    cancelling_events = await fetch_all(db, "SELECT kind FROM events WHERE turn_id = %s AND kind = "
                                            "'turn_cancelling'", (run.turn_id,))
    assert len(cancelling_events) == 1
    await finish(db, run, "cancelled")
    turn = await turn_row(db, run.turn_id)
    assert (turn["status"], turn["result_run_id"]) == ("cancelled", run.run_id)
    # Cancelling the parent never cancels its children.
    assert (await turn_row(db, child["turn_id"]))["status"] == "running"
    assert (await run_row(db, child_run_ref.run_id))["status"] == "running"
    async with db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id) is None  # already terminal


async def test_cancel_turn_of_another_session_is_not_found(db: Database, scope: Scope) -> None:
    _tree, run = await start_root_run(db, scope)
    other, _ = await start_root_run(db, scope)
    before = await count_rows(db)
    with pytest.raises(NotFound):
        async with db.tx() as conn:
            await turns.cancel_turn(conn, scope, other.root_id, run.turn_id)
    assert await count_rows(db) == before


async def test_a_cancel_during_a_tool_call_does_not_deadlock(db: Database, scope: Scope) -> None:
    """A human cancels the Turn while one of its tool calls is committing (the statements of
    ``cooperation.submit_input``, split where the cancel comes in): both must succeed."""
    tree, run = await start_root_run(db, scope)
    target, _ = await start_root_run(db, scope)
    args = {"target": str(target.root_id), "text": "work"}

    async def cancel() -> bool:
        async with db.tx() as conn:
            return await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id)

    async with db.tx() as conn:
        assert await receipts.begin_call(conn, run, "call-1", "submit_input", args) is None
        receipt = await turns.submit_input(conn, scope, target.root_id, "work", HUMAN)  # appends an event
        cancelling = asyncio.create_task(cancel())
        await asyncio.sleep(0.3)  # the cancel locks the Turn, then queues for the scope's event counter
        await asyncio.wait_for(
            receipts.store_result(conn, run, "call-1", "submit_input", args, {"input_id": str(receipt["input_id"])}),
            timeout=5)
    assert await asyncio.wait_for(cancelling, timeout=5) is True
    assert (await turn_row(db, run.turn_id))["status"] == "cancelling"
    stored = await fetch_one(db, "SELECT tool_name FROM tool_receipts WHERE turn_id = %s", (run.turn_id,))
    assert stored["tool_name"] == "submit_input"


async def _ended_turns(conn: Any, scope: Scope, session_id: uuid.UUID, count: int, mode: str) -> None:
    """``count`` consumed inputs of the session, each with its ended Turn of approval mode ``mode``."""
    await conn.execute(
        """WITH made AS (
               INSERT INTO inputs (input_id, session_id, user_id, app_id, text, status, origin)
               SELECT gen_random_uuid(), %(session_id)s, %(user_id)s, %(app_id)s, 'done', 'consumed', '{}'
               FROM generate_series(1, %(count)s) RETURNING input_id)
           INSERT INTO turns (turn_id, session_id, input_id, status, ended_at, approval_mode)
           SELECT gen_random_uuid(), %(session_id)s, input_id, 'completed', now(), %(mode)s FROM made""",
        {"session_id": session_id, "user_id": scope.user_id, "app_id": scope.app_id, "count": count, "mode": mode})


async def test_a_turn_of_an_auto_session_reads_none_of_its_history_to_know_none_asked(
        db: Database, scope: Scope) -> None:
    """A new Turn asks for approvals once an earlier Turn of its session asked (turn_insert.sql): in
    a database where most Turns ask (here 97 %), the planner could take an index of the session's
    every Turn over the asking ones' (turns_asked) to find none, each Turn of a long auto session
    then reading its whole history (1,000 rows here without turns_asked). In the plan a prepared
    statement settles on as well."""
    asking, auto = await make_tree(db, scope), await make_tree(db, scope)
    async with db.tx() as conn:
        await _ended_turns(conn, scope, asking.root_id, 30000, "ask")
        await _ended_turns(conn, scope, auto.root_id, 1000, "auto")
        await conn.execute("ANALYZE turns")
    for generic in (False, True):
        async with db.tx() as conn:
            await conn.execute(PLANNED_AT_SCALE)
            input_id = uuid.uuid4()
            await conn.execute("INSERT INTO inputs (input_id, session_id, user_id, app_id, text, status, origin) "
                               "VALUES (%s, %s, %s, %s, 'next', 'consumed', '{}')",
                               (input_id, auto.root_id, scope.user_id, scope.app_id))
            explaining = (GenericPlanExplainingConnection if generic else ExplainingConnection)(conn, run=False)
            await explaining.execute(query("turn_insert"),
                                     {"turn_id": uuid.uuid4(), "session_id": auto.root_id, "input_id": input_id})
            made = await (await conn.execute("UPDATE turns SET status = 'completed', ended_at = now() "
                                             "WHERE input_id = %s RETURNING approval_mode", (input_id,))).fetchall()
        assert made == [{"approval_mode": "auto"}]
        assert rows_read(explaining.plans[0], "turns") <= 1, (generic, explaining.plans[0])
