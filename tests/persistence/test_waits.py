"""Waits: parking releases the slot, and a wait is resumed exactly once by a resume Run of the same Turn."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from persistence import cooperation, events, trees, turns, waits
from persistence.db import Database
from persistence.errors import Conflict, InvalidArgument
from persistence.records import Row, RunRef, Scope
from tests.persistence.helpers import (
    DISPATCHER,
    HUMAN,
    PLANNED_AT_SCALE,
    ExplainingConnection,
    child_run,
    claim_turn,
    count_rows,
    create_child,
    expire_lease,
    fetch_all,
    fetch_one,
    finish,
    grant,
    rows_read,
    running_in_tree,
    seed_worked_tree,
    start_root_run,
    start_run,
    turn_row,
)


async def park(db: Database, run: RunRef, kind: str = "inputs", *, condition: dict[str, Any] | None = None,
               timeout: float | None = 300, targets: list[uuid.UUID] = (),  # type: ignore[assignment]
               request: dict[str, Any] | None = None) -> uuid.UUID:
    async with db.tx() as conn:
        return await waits.park(conn, run, tool_call_id=f"wait-{kind}", kind=kind, condition=condition or {},
                                timeout_seconds=timeout, targets=targets, request_payload=request)


async def try_resume(db: Database, wait_id: uuid.UUID) -> Row | None:
    async with db.tx() as conn:
        return await waits.try_resume(conn, wait_id)


async def wait_row(db: Database, wait_id: uuid.UUID) -> Row:
    return await fetch_one(db, "SELECT * FROM waits WHERE wait_id = %s", (wait_id,))


async def resume_runs(db: Database, turn_id: uuid.UUID) -> list[Row]:
    return await fetch_all(db, "SELECT run_id, kind, status, resumes_run_id FROM runs WHERE turn_id = %s "
                               "AND kind = 'resume'", (turn_id,))


async def test_park_releases_the_slot_and_resumes_once(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa, aaa_run = await child_run(db, run, "aaa")
    assert await running_in_tree(db, tree.tree_id) == 2

    wait_id = await park(db, run, condition={"input_ids": [aaa["input_id"]]},
                         targets=[uuid.UUID(aaa["session_id"])])
    assert (await fetch_one(db, "SELECT status, ended_at FROM runs WHERE run_id = %s", (run.run_id,)))["status"] \
        == "interrupted"
    turn = await turn_row(db, run.turn_id)
    assert (turn["status"], turn["waiting_for"]) == ("waiting", "cooperation")
    assert await running_in_tree(db, tree.tree_id) == 1
    assert await try_resume(db, wait_id) is None  # the child has not finished
    assert await resume_runs(db, run.turn_id) == []

    await finish(db, aaa_run, output="aaa's answer")
    async with db.tx() as conn:
        assert await waits.change_targets(conn, [uuid.UUID(aaa["session_id"])]) == ([tree.tree_id], [wait_id])
    resumed = await try_resume(db, wait_id)
    assert resumed is not None and await try_resume(db, wait_id) is None

    (resume,) = await resume_runs(db, run.turn_id)
    assert resume == {"run_id": resumed["run_id"], "kind": "resume", "status": "pending",
                      "resumes_run_id": run.run_id}
    row = await wait_row(db, wait_id)
    assert (row["status"], row["resumed_run_id"]) == ("resumed", resumed["run_id"])
    turn = await turn_row(db, run.turn_id)
    assert (turn["status"], turn["waiting_for"]) == ("running", None)

    new_run = await claim_turn(db, tree.tree_id, run.turn_id)
    assert new_run.run_id == resumed["run_id"] and new_run.turn_id == run.turn_id
    async with db.tx() as conn:
        wait = await waits.resumed_wait(conn, new_run.turn_id)
        assert wait is not None
        outcome = await waits.wait_outcome(conn, scope, wait, tree.root_id, new_run.turn_id)
    assert outcome["timed_out"] is False
    assert [(r["input_id"], r["output"], r["status"]) for r in outcome["results"]] == \
        [(uuid.UUID(aaa["input_id"]), "aaa's answer", "completed")]
    assert (await turn_row(db, run.turn_id))["approval_mode"] == "auto"  # what it read came from an auto Turn


async def test_a_resume_run_recovered_before_it_began_leaves_the_outcome_to_its_recovery(
        db: Database, scope: Scope) -> None:
    # The Run that resumes the wait is granted, but nobody acquires it before its lease runs out
    # (its activation died): the Run that recovers it finds the wait and delivers its outcome, so
    # the waiting call is answered instead of run again.
    tree, run = await start_root_run(db, scope)
    aaa, aaa_run = await child_run(db, run, "aaa")
    wait_id = await park(db, run, condition={"input_ids": [aaa["input_id"]]}, targets=[uuid.UUID(aaa["session_id"])])
    await finish(db, aaa_run, output="aaa's answer")
    resumed = await try_resume(db, wait_id)
    assert resumed is not None
    assert await grant(db, tree.tree_id) == [resumed["run_id"]]
    async with db.tx() as conn:
        await expire_lease(conn, resumed["run_id"])
        assert await turns.recover_expired_run(conn, resumed["run_id"]) is not None
    recovery = await claim_turn(db, tree.tree_id, run.turn_id)
    assert recovery.run_id != resumed["run_id"]
    async with db.tx() as conn:
        wait = await waits.resumed_wait(conn, recovery.turn_id)
        assert wait is not None and wait["wait_id"] == wait_id
        outcome = await waits.wait_outcome(conn, scope, wait, tree.root_id, recovery.turn_id)
    assert [(r["output"], r["status"]) for r in outcome["results"]] == [("aaa's answer", "completed")]


async def test_a_sweep_reaches_every_open_wait_however_many_have_deadlines(db: Database, scope: Scope) -> None:
    # A round took the soonest deadlines first: once a round's worth of waits with deadlines was open,
    # a question to a human (no deadline) whose wake-up was lost was never swept again.
    parked = []
    for _ in range(3):
        _, run = await start_root_run(db, scope)
        parked.append(await park(db, run, timeout=3600))
    _, asker = await start_root_run(db, scope)
    question = await park(db, asker, "answer", timeout=None, request={"question": "Which colour?"})
    _, late = await start_root_run(db, scope)
    expired = await park(db, late, timeout=3600)
    async with db.tx() as conn:
        await conn.execute("UPDATE waits SET deadline = now() - interval '1 second' WHERE wait_id = %s", (expired,))
    seen: list[uuid.UUID] = []
    after = waits.SWEEP_START
    for _ in range(1000):  # one whole cycle over the database's open waits, two a round
        async with db.tx() as conn:
            due, after = await waits.waits_to_sweep(conn, after, limit=2)
        assert expired in due  # a passed deadline is in every round
        seen += due
        if after == waits.SWEEP_START:
            break
    assert {*parked, question, expired} <= set(seen)


async def test_concurrent_resumes_create_one_resume_run(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    wait_id = await park(db, run, condition={"input_ids": []})  # an empty condition holds at once

    async with db.tx() as first:
        assert await waits.try_resume(first, wait_id) is not None
        second = asyncio.create_task(try_resume(db, wait_id))  # blocks on the wait row
        await asyncio.sleep(0.3)
        assert not second.done()
    assert await second is None

    many = await asyncio.gather(*(try_resume(db, wait_id) for _ in range(4)))
    assert many == [None] * 4
    (resume,) = await resume_runs(db, run.turn_id)
    assert resume["resumes_run_id"] == run.run_id


async def test_concurrent_resumes_racing_freely(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    wait_id = await park(db, run, condition={"input_ids": []})
    results = await asyncio.gather(*(try_resume(db, wait_id) for _ in range(6)))
    assert sum(result is not None for result in results) == 1
    assert len(await resume_runs(db, run.turn_id)) == 1


async def test_a_passed_deadline_resumes_with_timed_out(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    wait_id = await park(db, run, condition={"input_ids": [aaa["input_id"]]}, timeout=0)
    resumed = await try_resume(db, wait_id)
    assert resumed is not None
    new_run = await claim_turn(db, tree.tree_id, run.turn_id)
    async with db.tx() as conn:
        wait = await waits.resumed_wait(conn, new_run.turn_id)
        assert wait is not None
        outcome = await waits.wait_outcome(conn, scope, wait, tree.root_id, new_run.turn_id)
    assert outcome["timed_out"] is True and outcome["results"][0]["terminal"] is False


async def test_a_trees_change_targets_are_the_waits_watching_any_member(db: Database, scope: Scope) -> None:
    """What Stop all hints after its commit (it may end any member's Turn): a wait in another tree
    on a member's input was woken only by the sweep, the stop having named only the root."""
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    _other, watcher = await start_root_run(db, scope)
    async with db.tx() as conn:
        given = await turns.submit_input(conn, scope, uuid.UUID(aaa["session_id"]), "from elsewhere",
                                         {"kind": "session"})
    wait_id = await park(db, watcher, condition={"input_ids": [str(given["input_id"])]},
                         targets=[uuid.UUID(aaa["session_id"])])
    closed = await park(db, run, condition={"input_ids": [aaa["input_id"]]}, targets=[uuid.UUID(aaa["session_id"])])
    async with db.tx() as conn:
        await conn.execute("UPDATE waits SET status = 'cancelled' WHERE wait_id = %s", (closed,))
        assert await waits.tree_change_targets(conn, tree.tree_id) == ([tree.tree_id], [wait_id])


async def test_wait_sessions_resumes_on_an_update_after_the_cursor(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa, aaa_run = await child_run(db, run, "aaa")
    cursor = (await fetch_one(db, "SELECT last_cursor FROM scopes WHERE user_id = %s AND app_id = %s",
                              (scope.user_id, scope.app_id)))["last_cursor"]
    wait_id = await park(db, run, "sessions", condition={"targets": [aaa["session_id"]], "after_cursor": cursor},
                         targets=[uuid.UUID(aaa["session_id"])])
    assert await try_resume(db, wait_id) is None
    async with db.tx() as conn:  # the child's Turn asks (a message from an ask Turn made it)
        await conn.execute("UPDATE turns SET approval_mode = 'ask' WHERE turn_id = %s", (aaa_run.turn_id,))
    await finish(db, aaa_run, output="done")
    assert await try_resume(db, wait_id) is not None
    new_run = await claim_turn(db, tree.tree_id, run.turn_id)
    async with db.tx() as conn:
        wait = await waits.resumed_wait(conn, new_run.turn_id)
        assert wait is not None
        outcome = await waits.wait_outcome(conn, scope, wait, tree.root_id, new_run.turn_id)
    assert [u["kind"] for u in outcome["updates"]] == ["turn_completed"]
    assert outcome["cursor"] > cursor and outcome["timed_out"] is False
    assert (await turn_row(db, run.turn_id))["approval_mode"] == "ask"  # it took in an ask Turn's answer


async def test_ask_user_blocks_new_input_until_answered(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    other_tree, other_run = await start_root_run(db, scope)
    wait_id = await park(db, run, "answer", timeout=None, request={"question": "Which colour?"})
    turn = await turn_row(db, run.turn_id)
    assert (turn["status"], turn["waiting_for"]) == ("waiting", "answer")
    assert await running_in_tree(db, tree.tree_id) == 0
    async with db.tx() as conn:
        (request,) = await trees.pending_requests(conn, scope, tree.root_id)
        assert await trees.pending_requests(conn, scope, other_tree.root_id) == []
        kinds = [e["kind"] for e in await events.events_after(conn, scope, 0, session_id=tree.root_id)]
    assert (request["kind"], request["payload"], request["path"]) == ("question", {"question": "Which colour?"},
                                                                      "/root")
    assert "waiting_answer" in kinds

    before = await count_rows(db)
    with pytest.raises(Conflict, match="waiting for a human answer"):
        async with db.tx() as conn:
            await turns.submit_input(conn, scope, tree.root_id, "new work", HUMAN)
    with pytest.raises(Conflict):
        async with db.tx() as conn:
            await cooperation.submit_input(conn, other_run, "s1", target=str(tree.root_id), text="new work",
                                           dispatcher=DISPATCHER)
    with pytest.raises(InvalidArgument):
        async with db.tx() as conn:
            await trees.answer_request(conn, scope, request["id"], {"decision": "approve"})
    assert await count_rows(db) == before
    assert await try_resume(db, wait_id) is None  # not answered yet

    async with db.tx() as conn:
        await trees.answer_request(conn, scope, request["id"], {"answer": "green"})
    with pytest.raises(Conflict, match="already answered"):
        async with db.tx() as conn:
            await trees.answer_request(conn, scope, request["id"], {"answer": "blue"})
    assert await try_resume(db, wait_id) is not None
    new_run = await claim_turn(db, tree.tree_id, run.turn_id)
    async with db.tx() as conn:
        wait = await waits.resumed_wait(conn, new_run.turn_id)
        assert wait is not None
        assert await waits.wait_outcome(conn, scope, wait, tree.root_id, new_run.turn_id) == {"answer": "green"}
    stored = await fetch_one(db, "SELECT status, response FROM requests WHERE request_id = %s", (request["id"],))
    assert stored == {"status": "answered", "response": {"answer": "green"}}


async def test_denied_approval_resumes_with_deny(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    wait_id = await park(db, run, "approval", timeout=None, request={"command": "rm -rf build"})
    assert (await turn_row(db, run.turn_id))["waiting_for"] == "approval"
    async with db.tx() as conn:
        (request,) = await trees.pending_requests(conn, scope, tree.root_id)
        await trees.answer_request(conn, scope, request["id"], {"decision": "deny"})
    assert await try_resume(db, wait_id) is not None
    new_run = await claim_turn(db, tree.tree_id, run.turn_id)
    async with db.tx() as conn:
        wait = await waits.resumed_wait(conn, new_run.turn_id)
        assert wait is not None
        cur = await conn.execute("SELECT status, response FROM requests WHERE wait_id = %s", (wait["wait_id"],))
        assert await cur.fetchone() == {"status": "answered", "response": {"decision": "deny"}}


async def test_cancelling_a_waiting_turn_cancels_its_wait_and_request(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    wait_id = await park(db, run, "answer", timeout=None, request={"question": "?"})
    async with db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id) is False  # nothing runs
    turn = await turn_row(db, run.turn_id)
    assert (turn["status"], turn["result_run_id"]) == ("cancelled", run.run_id)
    assert (await wait_row(db, wait_id))["status"] == "cancelled"
    assert (await fetch_one(db, "SELECT status FROM requests WHERE wait_id = %s", (wait_id,)))["status"] == \
        "cancelled"
    assert await try_resume(db, wait_id) is None
    assert await resume_runs(db, run.turn_id) == []


async def test_a_park_racing_a_cancel_does_not_lose_the_cancel(db: Database, scope: Scope) -> None:
    """A human cancels while the Run is parking: the cancel must win, not be overwritten by 'waiting'."""
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id) is True  # live Run: cancelling
        parking = asyncio.create_task(park(db, run, condition={"input_ids": []}))
        await asyncio.sleep(0.3)
        assert not parking.done()  # blocked behind the cancel's lock on the Turn
    with pytest.raises(Conflict, match="being cancelled"):
        await parking
    turn = await turn_row(db, run.turn_id)
    assert turn["status"] == "cancelling"
    assert await fetch_all(db, "SELECT wait_id FROM waits WHERE turn_id = %s", (run.turn_id,)) == []
    await finish(db, run, "cancelled")  # the Run sees the cancel at its boundary and ends the Turn
    assert (await turn_row(db, run.turn_id))["status"] == "cancelled"


async def test_park_after_a_committed_cancel_is_refused(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id)
    before = await count_rows(db)
    with pytest.raises(Conflict):
        await park(db, run, condition={"input_ids": []})
    assert await count_rows(db) == before
    assert await grant(db, tree.tree_id) == []


async def test_a_waiter_is_told_of_a_long_question_by_its_start(db: Database, scope: Scope) -> None:
    """wait_sessions hands its updates to the model: a child's question of 100,000 characters reaches
    the waiting parent as its first 500 (a hundred such updates were a tool result of 10 MB); the
    event keeps the whole question for the human's view."""
    tree, run = await start_root_run(db, scope)
    child, child_run_ = await child_run(db, run, "asker")
    question = "why? " * 20_000
    await park(db, child_run_, "answer", timeout=None, request={"question": question, "tool_call_id": "call-9"})

    async with db.tx() as conn:
        updates = await events.session_updates_after(conn, scope, tree.root_id, [uuid.UUID(child["session_id"])], 0)
        stored = await events.events_after(conn, scope, 0, session_id=uuid.UUID(child["session_id"]))

    [told] = [u for u in updates if u["kind"] == "waiting_answer"]
    assert told["payload"] == {"question": question[:500] + "... (100000 characters)", "tool_call_id": "call-9"}
    [kept] = [e for e in stored if e["kind"] == "waiting_answer"]
    assert kept["payload"]["question"] == question


async def test_a_change_finds_the_open_waits_watching_it_not_every_wait_that_ever_did(db: Database,
                                                                                      scope: Scope) -> None:
    """Every Turn's end, park and tool step asks which open waits watch its session: it read every
    wait that ever watched it, each then found closed (a parent waited on in a loop: thousands)."""
    tree = await seed_worked_tree(db, scope, members=3, turns_per_member=100, wait_every=1)  # 200 waits, closed
    async with db.tx() as conn:
        child = (await (await conn.execute("SELECT session_id FROM sessions WHERE parent_id = %s LIMIT 1",
                                           (tree.root_id,))).fetchone() or {})["session_id"]
    _receipt, run = await start_run(db, scope, tree.tree_id, child)
    async with db.tx() as conn:
        still_open = await waits.park(conn, run, tool_call_id="w", kind="sessions", timeout_seconds=None,
                                      condition={"targets": [str(tree.root_id)], "after_cursor": 0},
                                      targets=[tree.root_id])
    elsewhere, root_run = await start_root_run(db, scope)
    for number in range(100):  # open waits of another conversation, on its root
        _member, member_run = await child_run(db, root_run, f"m{number}")
        async with db.tx() as conn:
            await waits.park(conn, member_run, tool_call_id="w", kind="sessions", timeout_seconds=None,
                             condition={"targets": [str(elsewhere.root_id)], "after_cursor": 0},
                             targets=[elsewhere.root_id])
    async with db.tx() as conn:
        await conn.execute("ANALYZE wait_targets, waits")
        await conn.execute(PLANNED_AT_SCALE)
        explaining = ExplainingConnection(conn)
        _trees, watching = await waits.change_targets(explaining, [tree.root_id])  # type: ignore[arg-type]
        ever = await (await conn.execute("SELECT count(*) AS n FROM wait_targets WHERE session_id = %s",
                                         (tree.root_id,))).fetchone()
    assert watching == [still_open] and ever is not None and ever["n"] == 201
    plan = explaining.plans[-1]
    assert rows_read(plan, "wait_targets") <= 1 and rows_read(plan, "waits") <= 1, plan
    async with db.tx() as conn:  # a wait cancelled with its Turn watches no more, as one resumed
        assert await turns.cancel_turn(conn, scope, child, run.turn_id) is not None
        assert await waits.change_targets(conn, [tree.root_id]) == ([tree.tree_id], [])
