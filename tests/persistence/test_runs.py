"""Slots, leases and recovery: a tree never has more running Runs than slots, grants are FIFO,
and a Run whose owner died is resumed exactly once while the stale owner can write nothing."""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import pytest

from persistence import cooperation, messages, runs, sessions, turns
from persistence.db import Database
from persistence.errors import LeaseLost
from persistence.records import Row, RunRef, Scope
from tests.persistence.helpers import (
    ACTIVE_RUNS_INDEXES,
    DISPATCHER,
    LEASE_SECONDS,
    PLANNED_AT_SCALE,
    ExplainingConnection,
    acquire,
    child_run,
    claim_turn,
    count_rows,
    create_child,
    expire_lease,
    fetch_all,
    finish,
    grant,
    indexes_read,
    latest_run_id,
    limits,
    make_tree,
    new_owner,
    run_row,
    running_in_tree,
    seed_worked_tree,
    start_root_run,
    start_run,
    submit,
    turn_row,
    until_a_lock_is_awaited,
)


async def _expire(db: Database, run: RunRef) -> None:
    async with db.tx() as conn:
        await expire_lease(conn, run.run_id)


async def test_a_fifth_run_waits_for_a_slot_even_from_a_grandchild(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope)
    _, aaa_run = await child_run(db, root_run, "aaa")
    _, bbb_run = await child_run(db, root_run, "bbb")
    _, _ccc_run = await child_run(db, root_run, "ccc")
    assert await running_in_tree(db, tree.tree_id) == 4

    grandchild = await create_child(db, aaa_run, "ddd")  # /root/aaa/ddd: same tree, same slots
    fifth = await latest_run_id(db, grandchild["turn_id"])
    assert await grant(db, tree.tree_id) == []
    assert (await run_row(db, fifth))["status"] == "pending"
    assert await running_in_tree(db, tree.tree_id) == 4

    await finish(db, bbb_run, output="bbb done")  # releases one slot in the same transaction
    assert await running_in_tree(db, tree.tree_id) == 3
    assert await grant(db, tree.tree_id) == [fifth]
    row = await run_row(db, fifth)
    assert row["status"] == "running" and row["started_at"] is not None
    assert await running_in_tree(db, tree.tree_id) == 4


async def test_slots_are_per_tree_not_per_parent(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope, slot_limit=2)
    _, aaa_run = await child_run(db, root_run, "aaa")
    bbb = await create_child(db, aaa_run, "bbb")
    other_tree, _ = await start_root_run(db, scope, slot_limit=2)  # another tree has its own slots
    assert await grant(db, tree.tree_id) == []
    assert (await run_row(db, await latest_run_id(db, bbb["turn_id"])))["status"] == "pending"
    assert await running_in_tree(db, other_tree.tree_id) == 1


async def test_slots_are_granted_in_fifo_order(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope, slot_limit=1)
    children = [await create_child(db, root_run, name) for name in ("c1", "c2", "c3", "c4")]
    queued = [await latest_run_id(db, child["turn_id"]) for child in children]
    assert await grant(db, tree.tree_id) == []

    await finish(db, root_run)
    order = []
    for _ in queued:
        granted = await grant(db, tree.tree_id)
        assert len(granted) == 1
        order.extend(granted)
        await finish(db, await acquire(db, granted[0]))
    assert order == queued
    started = await fetch_all(db, "SELECT run_id FROM runs WHERE run_id = ANY(%s) ORDER BY started_at", (queued,))
    assert [row["run_id"] for row in started] == queued


async def test_one_grant_fills_every_free_slot_oldest_first(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope, slot_limit=3)
    children = [await create_child(db, root_run, f"c{i}") for i in range(4)]
    queued = [await latest_run_id(db, child["turn_id"]) for child in children]
    granted = await grant(db, tree.tree_id)
    assert granted == queued[:2]
    assert (await run_row(db, queued[2]))["status"] == "pending"


async def test_a_finishing_run_hands_its_slot_to_the_oldest_queued_run(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope, slot_limit=1)
    children = [await create_child(db, root_run, name) for name in ("c1", "c2")]
    queued = [await latest_run_id(db, child["turn_id"]) for child in children]
    async with db.tx() as conn:
        await turns.finish_turn(conn, root_run, "completed", output="done")
        handed = await runs.hand_off_slots(conn, tree.tree_id, LEASE_SECONDS)
    assert [row["run_id"] for row in handed or []] == queued[:1]  # FIFO, and one slot only
    assert [(await run_row(db, run_id))["status"] for run_id in queued] == ["running", "pending"]


async def test_a_hand_off_never_waits_for_the_trees_lock(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope, slot_limit=2)
    child = await create_child(db, root_run, "c1")
    before = await count_rows(db)
    async with db.tx() as holder:  # e.g. the supervisor granting, or a stop
        await holder.execute("SELECT 1 FROM trees WHERE tree_id = %s FOR UPDATE", (tree.tree_id,))
        async with db.tx() as conn:
            assert await asyncio.wait_for(runs.hand_off_slots(conn, tree.tree_id, LEASE_SECONDS), 5) is None
    assert await count_rows(db) == before
    assert (await run_row(db, await latest_run_id(db, child["turn_id"])))["status"] == "pending"


async def test_concurrent_grants_never_exceed_the_limit(db: Database, scope: Scope) -> None:
    slot_limit, workers, members, inputs_each = 4, 8, 12, 6
    tree = await make_tree(db, scope, slot_limit=slot_limit)
    _, root_run = await start_run(db, scope, tree.tree_id, tree.root_id)
    names = [f"m{i}" for i in range(members)]
    for name in names:
        await create_child(db, root_run, name, max_depth=2)
    for name in names:
        for n in range(inputs_each - 1):
            async with db.tx() as conn:
                await cooperation.submit_input(conn, root_run, f"more-{name}-{n}", target=f"/root/{name}",
                                               text=f"task {n}", dispatcher=DISPATCHER)
    await finish(db, root_run)
    total_turns = members * inputs_each
    observed_max = 0
    rng = random.Random(7)

    async def worker() -> None:
        nonlocal observed_max
        while True:
            async with db.tx() as conn:
                granted = await runs.grant_slots(conn, tree.tree_id, LEASE_SECONDS)
                owned = [await runs.acquire_run(conn, row["run_id"], new_owner(), LEASE_SECONDS) for row in granted]
                cur = await conn.execute("SELECT count(*) AS n FROM runs WHERE tree_id = %s AND status = 'running'",
                                         (tree.tree_id,))
                running = (await cur.fetchone() or {"n": 0})["n"]
            observed_max = max(observed_max, running)
            if not owned:
                async with db.tx() as conn:
                    cur = await conn.execute(
                        "SELECT count(*) AS n FROM runs WHERE tree_id = %s AND status IN ('pending', 'running')",
                        (tree.tree_id,))
                    left = (await cur.fetchone() or {"n": 0})["n"]
                if left == 0:
                    return
                await asyncio.sleep(rng.random() / 200)
                continue
            await asyncio.sleep(rng.random() / 100)
            for run in owned:
                assert run is not None
                await finish(db, run, output=f"out {run.run_id}")

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), timeout=120)

    assert 1 <= observed_max <= slot_limit
    rows = await fetch_all(
        db, "SELECT started_at, ended_at, status FROM runs WHERE tree_id = %s AND session_id <> %s",
        (tree.tree_id, tree.root_id))
    assert len(rows) == total_turns and all(row["status"] == "completed" for row in rows)
    # From the rows: at no instant did more than slot_limit Runs hold a slot.
    points = sorted([(row["started_at"], 1) for row in rows] + [(row["ended_at"], -1) for row in rows],
                    key=lambda p: (p[0], p[1]))
    held, peak = 0, 0
    for _, delta in points:
        held += delta
        peak = max(peak, held)
    assert peak <= slot_limit
    assert peak >= 2  # the workers really overlapped


async def test_acquire_needs_a_granted_unowned_run(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    receipt = await submit(db, scope, tree.root_id)
    run_id = await latest_run_id(db, receipt["turn_id"])
    async with db.tx() as conn:
        assert await runs.acquire_run(conn, run_id, "early", LEASE_SECONDS) is None  # still pending
        assert await runs.acquire_next_run(conn, tree.root_id, "early", LEASE_SECONDS) is None
    assert (await run_row(db, run_id))["owner"] is None
    await grant(db, tree.tree_id)
    async with db.tx() as conn:
        assert await runs.has_claimable_run(conn, tree.root_id)
    async with db.tx() as conn:
        acquired = await runs.acquire_next_run(conn, tree.root_id, "owner-a", LEASE_SECONDS)
    assert acquired is not None and acquired.run.run_id == run_id
    first = acquired.run
    async with db.tx() as conn:
        assert await runs.acquire_run(conn, run_id, "owner-b", LEASE_SECONDS) is None
        assert await runs.acquire_next_run(conn, tree.root_id, "owner-b", LEASE_SECONDS) is None
        assert not await runs.has_claimable_run(conn, tree.root_id)
        # The acquisition read what the Run reads first, as the separate read finds it.
        assert (acquired.session, acquired.turn_input) == await sessions.session_and_turn_input(conn, first)
    row = await run_row(db, run_id)
    assert row["owner"] == "owner-a" and first.owner == "owner-a"
    assert first.session_id == tree.root_id and first.turn_id == uuid.UUID(str(receipt["turn_id"]))
    assert acquired.turn_input == sessions.TurnInput(uuid.UUID(str(receipt["input_id"])), None)


async def test_a_run_handed_back_by_its_owner_keeps_its_slot_for_the_next_incarnation(db: Database,
                                                                                      scope: Scope) -> None:
    """A Run handed back (its host moves) stays running, holding its slot, for another incarnation to
    acquire; an impostor's or an expired owner's hand-back is refused and changes nothing."""
    tree, run = await start_root_run(db, scope)
    impostor = RunRef(run.scope, run.session_id, run.tree_id, run.turn_id, run.run_id, "impostor")
    before = await run_row(db, run.run_id)
    with pytest.raises(LeaseLost):
        async with db.tx() as conn:
            await runs.hand_back(conn, impostor, LEASE_SECONDS)
    assert await run_row(db, run.run_id) == before

    async with db.tx() as conn:
        await runs.hand_back(conn, run, LEASE_SECONDS)
    row = await run_row(db, run.run_id)
    assert (row["status"], row["owner"]) == ("running", None)
    assert await running_in_tree(db, tree.tree_id) == 1  # the slot stays the Run's
    async with db.tx() as conn:
        assert await runs.over(conn, [run.run_id]) == set()
    with pytest.raises(LeaseLost):  # the old owner can neither hand it back again nor write
        async with db.tx() as conn:
            await runs.hand_back(conn, run, LEASE_SECONDS)
    with pytest.raises(LeaseLost):
        await finish(db, run, output="gone")
    async with db.tx() as conn:
        acquired = await runs.acquire_next_run(conn, tree.root_id, "next-incarnation", LEASE_SECONDS)
    assert acquired is not None and acquired.run.run_id == run.run_id and acquired.run.kind == run.kind

    _, expired = await start_root_run(db, scope)
    await _expire(db, expired)
    before = await run_row(db, expired.run_id)
    with pytest.raises(LeaseLost):  # too late: the sweep recovers it instead
        async with db.tx() as conn:
            await runs.hand_back(conn, expired, LEASE_SECONDS)
    assert await run_row(db, expired.run_id) == before


async def test_heartbeat_extends_the_lease_only_for_its_owner(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    before = (await run_row(db, run.run_id))["lease_expires_at"]
    async with db.tx() as conn:
        assert await runs.heartbeat(conn, [run], 600) == {run.run_id: "running"}
        impostor = RunRef(run.scope, run.session_id, run.tree_id, run.turn_id, run.run_id, "impostor")
        assert await runs.heartbeat(conn, [impostor], 600) == {}
    assert (await run_row(db, run.run_id))["lease_expires_at"] > before


async def test_one_heartbeat_renews_every_run_still_held_and_names_them(db: Database, scope: Scope) -> None:
    """A process's Runs in one statement: those it still holds are renewed, with their Turns' status;
    one whose lease lapsed is neither renewed nor named (its incarnation must stop)."""
    _, root = await start_root_run(db, scope)
    _, aaa = await child_run(db, root, "aaa")
    _, bbb = await child_run(db, root, "bbb")
    await _expire(db, bbb)
    before = {run.run_id: (await run_row(db, run.run_id))["lease_expires_at"] for run in (root, aaa, bbb)}
    async with db.tx() as conn:
        assert await runs.heartbeat(conn, [bbb, root, aaa], 600) == {root.run_id: "running", aaa.run_id: "running"}
        assert await runs.heartbeat(conn, [], 600) == {}
    after = {run.run_id: (await run_row(db, run.run_id))["lease_expires_at"] for run in (root, aaa, bbb)}
    assert after[root.run_id] > before[root.run_id] and after[aaa.run_id] > before[aaa.run_id]
    assert after[bbb.run_id] == before[bbb.run_id]


async def test_a_run_whose_row_is_locked_is_still_held_and_does_not_hold_up_the_others(db: Database,
                                                                                     scope: Scope) -> None:
    """A Run's own commit waiting on a lock holds its row: the beat names it (it must not stop) without
    waiting for it, and renews the others at once; a later beat renews it."""
    _, root = await start_root_run(db, scope)
    _, aaa = await child_run(db, root, "aaa")
    before = {run.run_id: (await run_row(db, run.run_id))["lease_expires_at"] for run in (root, aaa)}
    async with db.tx() as committing:
        await runs.fence(committing, aaa)  # aaa's commit, under way
        async with db.tx() as conn:
            assert await runs.heartbeat(conn, [root, aaa], 600) == {root.run_id: "running", aaa.run_id: "running"}
        assert (await run_row(db, aaa.run_id))["lease_expires_at"] == before[aaa.run_id]
    assert (await run_row(db, root.run_id))["lease_expires_at"] > before[root.run_id]
    async with db.tx() as conn:
        await runs.heartbeat(conn, [root, aaa], 600)
    assert (await run_row(db, aaa.run_id))["lease_expires_at"] > before[aaa.run_id]


async def test_a_run_mid_commit_is_waited_for_briefly_and_renewed(db: Database, scope: Scope) -> None:
    """A Run that commits step after step holds its row most of the time: a beat that only skipped it
    let its lease run out (a 100-step Turn's Run was recovered and one model call asked twice)."""
    _, run = await start_root_run(db, scope)
    before = (await run_row(db, run.run_id))["lease_expires_at"]

    async def beat() -> dict[uuid.UUID, str]:
        async with db.tx() as conn:
            return await runs.heartbeat(conn, [run], 600, busy_wait_seconds=30)

    async with db.tx() as committing:
        await runs.fence(committing, run)
        beating = asyncio.create_task(beat())
        await until_a_lock_is_awaited(db, "FOR NO KEY UPDATE OF r2")
    assert await beating == {run.run_id: "running"}
    assert (await run_row(db, run.run_id))["lease_expires_at"] > before


async def test_a_run_whose_lease_runs_out_while_its_row_is_locked_is_judged_once_it_is_not(db: Database,
                                                                                          scope: Scope) -> None:
    """A commit fenced while the lease held may go on past it (its writes are checked at its start):
    the beats meanwhile neither renew nor drop the Run, which stopping would cut the commit off;
    the first beat that can lock its row finds the lease run out."""
    _, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await runs.heartbeat(conn, [run], 0.5)
    async with db.tx() as committing:
        await runs.fence(committing, run)
        await asyncio.sleep(0.7)  # the lease runs out during the commit
        async with db.tx() as conn:
            assert await runs.heartbeat(conn, [run], 600) == {run.run_id: "running"}
    async with db.tx() as conn:
        assert await runs.heartbeat(conn, [run], 600) == {}


async def test_expired_lease_is_recovered_by_exactly_one_resume_run(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    await _expire(db, run)
    async with db.tx() as conn:
        assert run.run_id in await runs.expired_runs(conn, skip=[])
        assert run.run_id not in await runs.expired_runs(conn, skip=[run.run_id])  # being recovered already
        assert await runs.over(conn, [run.run_id, uuid.uuid4()]) == set()  # expired is not yet over; unknown never
        recovered = await turns.recover_expired_run(conn, run.run_id)
    assert recovered == {"tree_id": tree.tree_id, "session_id": tree.root_id}
    async with db.tx() as conn:
        assert await turns.recover_expired_run(conn, run.run_id) is None  # nothing due any more

    old = await run_row(db, run.run_id)
    assert old["status"] == "interrupted" and old["error"] == runs.LEASE_EXPIRED
    resumes = await fetch_all(db, "SELECT run_id, kind, status, resumes_run_id FROM runs WHERE turn_id = %s "
                                  "AND run_id <> %s", (run.turn_id, run.run_id))
    assert len(resumes) == 1
    assert resumes[0]["kind"] == "resume" and resumes[0]["resumes_run_id"] == run.run_id
    assert resumes[0]["status"] == "pending"
    async with db.tx() as conn:  # whoever waits on a reply for the dead owner's Run waits for nothing
        assert await runs.over(conn, [run.run_id, resumes[0]["run_id"]]) == {run.run_id}
    assert (await turn_row(db, run.turn_id))["status"] == "running"
    assert await running_in_tree(db, tree.tree_id) == 0  # the dead owner's slot is free
    resumed = await claim_turn(db, tree.tree_id, run.turn_id)
    assert resumed.run_id == resumes[0]["run_id"]


async def test_concurrent_recoveries_create_one_resume_run(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    await _expire(db, run)

    async def recover() -> object:
        async with db.tx() as conn:
            result = await turns.recover_expired_run(conn, run.run_id)
            await asyncio.sleep(0.05)  # hold the transaction open so the attempts overlap
            return result

    results = await asyncio.gather(*(recover() for _ in range(4)))
    assert sum(result is not None for result in results) == 1
    resumes = await fetch_all(db, "SELECT run_id FROM runs WHERE resumes_run_id = %s", (run.run_id,))
    assert len(resumes) == 1


async def test_recovering_a_cancelling_turn_finalises_the_cancel(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:  # live run: signal
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id, reason="cancelled by session X") is True
    assert (await turn_row(db, run.turn_id))["status"] == "cancelling"
    await _expire(db, run)
    async with db.tx() as conn:
        await turns.recover_expired_run(conn, run.run_id)
    turn = await turn_row(db, run.turn_id)
    assert turn["status"] == "cancelled" and turn["result_run_id"] == run.run_id
    assert await fetch_all(db, "SELECT run_id FROM runs WHERE resumes_run_id = %s", (run.run_id,)) == []
    # The Result says why, as the turn_cancelled event does (it said the lease expired); the Run keeps
    # its own account of how it ended.
    assert (await _result(db, scope, run.turn_id))["error"] == "cancelled by session X"
    assert (await run_row(db, run.run_id))["error"] == runs.LEASE_EXPIRED


async def _die_until_given_up(db: Database, tree_id: uuid.UUID, run: RunRef) -> RunRef:
    """Let the Turn's Runs die one after another, none committing anything, until it is given up (at
    most the limit's number); the last Run."""
    for _ in range(runs.MAX_RECOVERIES_PER_TURN):
        await _expire(db, run)
        async with db.tx() as conn:
            await turns.recover_expired_run(conn, run.run_id)
        if (await turn_row(db, run.turn_id))["status"] != "running":
            break
        run = await claim_turn(db, tree_id, run.turn_id)
    return run


async def test_a_turn_whose_runs_keep_dying_fails(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    run = await _die_until_given_up(db, tree.tree_id, run)
    turn = await turn_row(db, run.turn_id)
    assert turn["status"] == "failed" and turn["result_run_id"] == run.run_id
    assert await running_in_tree(db, tree.tree_id) == 0
    assert (await _result(db, scope, run.turn_id))["error"].startswith("the turn's runs kept dying")


async def _result(db: Database, scope: Scope, turn_id: uuid.UUID) -> Row:
    async with db.tx() as conn:
        return await turns.get_result(conn, scope, turn_id=turn_id)


async def test_only_runs_that_die_without_progress_in_a_row_count_toward_giving_up(db: Database,
                                                                                  scope: Scope) -> None:
    # Each lease lost (a deploy, a database restart, a lost node) counted for the Turn's whole life:
    # a long Turn that made progress in every Run was failed after five unrelated outages.
    tree, run = await start_root_run(db, scope)
    for step in range(2 * runs.MAX_RECOVERIES_PER_TURN):
        call = {"id": f"call-{step}", "name": "list_sessions", "arguments": {}}
        async with db.tx() as conn:
            await messages.append_reply(conn, run, content=None, tool_calls=[call],
                                        usage={"prompt_tokens": 4, "completion_tokens": 2}, cost_usd=0.0)
            await messages.append_tool_results(conn, run, [(call["id"], '{"sessions": []}')])
        await _expire(db, run)
        async with db.tx() as conn:
            await turns.recover_expired_run(conn, run.run_id)
        assert (await turn_row(db, run.turn_id))["status"] == "running", f"given up after {step + 1} outages"
        run = await claim_turn(db, tree.tree_id, run.turn_id)
    run = await _die_until_given_up(db, tree.tree_id, run)  # and then Runs that die before committing anything
    assert (await turn_row(db, run.turn_id))["status"] == "failed"
    dead = await fetch_all(db, "SELECT count(*) AS n FROM runs WHERE turn_id = %s AND error = %s",
                           (run.turn_id, runs.LEASE_EXPIRED))
    assert dead[0]["n"] == 3 * runs.MAX_RECOVERIES_PER_TURN


async def test_a_stale_owner_is_fenced_and_writes_nothing(db: Database, scope: Scope) -> None:
    _tree, run = await start_root_run(db, scope)
    await create_child(db, run, "aaa", call_id="made-aaa")
    await _expire(db, run)

    # Expired but not yet recovered: already refused.
    before = await count_rows(db)
    with pytest.raises(LeaseLost):
        await finish(db, run, output="too late")
    async with db.tx() as conn:
        await turns.recover_expired_run(conn, run.run_id)
    before = await count_rows(db)
    stale_writes = [
        lambda conn: turns.finish_turn(conn, run, "completed", output="too late"),
        lambda conn: cooperation.send_message(conn, run, "late-1", target="/root/aaa", text="hi"),
        lambda conn: cooperation.submit_input(conn, run, "late-2", target="/root/aaa", text="hi",
                                                dispatcher=DISPATCHER),
        lambda conn: cooperation.create_session(conn, run, "late-3", name="bbb", description="x", limits=limits(),
                                                dispatcher=DISPATCHER),
        # A replay of a call that ran before is refused too, not answered from its receipt.
        lambda conn: cooperation.create_session(conn, run, "made-aaa", name="aaa", description="do the child's task",
                                                limits=limits(), dispatcher=DISPATCHER),
        lambda conn: messages.take_boundary(conn, run),
        lambda conn: messages.append_reply(conn, run, content="late", tool_calls=None, usage={"prompt_tokens": 5},
                                           cost_usd=0.1),
    ]
    for write in stale_writes:
        with pytest.raises(LeaseLost):
            async with db.tx() as conn:
                await write(conn)
    async with db.tx() as conn:
        assert await runs.heartbeat(conn, [run], LEASE_SECONDS) == {}
    assert await count_rows(db) == before
    assert (await turn_row(db, run.turn_id))["status"] == "running"  # the resume Run owns the Turn now


async def test_another_owner_is_fenced(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    impostor = RunRef(run.scope, run.session_id, run.tree_id, run.turn_id, run.run_id, "impostor")
    before = await count_rows(db)
    with pytest.raises(LeaseLost):
        await finish(db, impostor, output="not mine")
    assert await count_rows(db) == before
    assert (await run_row(db, run.run_id))["status"] == "running"


async def test_the_sweepers_views_follow_a_run_from_queue_to_end(db: Database, scope: Scope) -> None:
    """Queued trees, grants no actor took, and a tree's active Runs, as the sweeper and supervisor read them."""
    tree = await make_tree(db, scope, slot_limit=1)
    receipt = await submit(db, scope, tree.root_id)
    async with db.tx() as conn:
        assert tree.tree_id in await runs.trees_with_queued_runs(conn)
        assert await runs.tree_has_active_runs(conn, tree.tree_id)
    await grant(db, tree.tree_id)  # running, and no owner yet
    async with db.tx() as conn:
        assert tree.tree_id not in await runs.trees_with_queued_runs(conn)
        assert tree.root_id not in await runs.sessions_with_unowned_grants(conn, 3600)  # granted too recently
        assert tree.root_id in await runs.sessions_with_unowned_grants(conn, 0)
    run = await acquire(db, await latest_run_id(db, receipt["turn_id"]))
    async with db.tx() as conn:
        assert tree.root_id not in await runs.sessions_with_unowned_grants(conn, 0)
        assert await runs.tree_has_active_runs(conn, tree.tree_id)
    await finish(db, run)
    async with db.tx() as conn:
        assert not await runs.tree_has_active_runs(conn, tree.tree_id)


async def test_whether_a_tree_is_active_is_read_from_its_active_runs_alone(db: Database, scope: Scope) -> None:
    """A tree's supervisor asks every CANOPY_SWEEP_SECONDS while the tree is live: a status IN list
    proved neither status's partial index, and the answer read every Run the tree ever had. It reads
    active Runs alone (a tree that holds most of the table's Runs, as here, may have a planner look
    among every session's running ones: those are as many as the slots in use, never a history)."""
    tree = await seed_worked_tree(db, scope, members=3, turns_per_member=100, wait_every=0)
    await submit(db, scope, tree.root_id)  # one queued Run
    async with db.tx() as conn:
        await conn.execute("ANALYZE runs")
        await conn.execute(PLANNED_AT_SCALE)
        explaining = ExplainingConnection(conn)
        assert await runs.tree_has_active_runs(explaining, tree.tree_id)  # type: ignore[arg-type]
        history = await (await conn.execute("SELECT count(*) AS n FROM runs WHERE tree_id = %s",
                                            (tree.tree_id,))).fetchone()
    assert history is not None and history["n"] == 301
    assert indexes_read(explaining.plans[-1], "runs") <= ACTIVE_RUNS_INDEXES, json.dumps(explaining.plans[-1])
