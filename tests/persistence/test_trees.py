"""Whole-tree operations: the constant-query summary, stop all, continue, archive."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg.rows import dict_row

from persistence import cooperation, runs, sessions, trees, turns, waits
from persistence.db import Database
from persistence.errors import Conflict, InvalidArgument
from persistence.records import Row, Scope
from tests.persistence.helpers import (
    AGENT_CONFIG,
    DISPATCHER,
    HUMAN,
    STOP_LOCKING_MEMBERS,
    Tree,
    claim_turn,
    count_rows,
    create_child,
    fetch_all,
    fetch_one,
    finish,
    grant,
    limits,
    make_tree,
    session_row,
    start_root_run,
    start_run,
    submit,
    turn_row,
    until_a_lock_is_awaited,
)
from tests.persistence.test_waits import park, try_resume

SECRET_OUTPUT = "SECRET-OUTPUT-BODY-7f3a"


class CountingCursor(psycopg.AsyncCursor[Any]):
    """Counts every statement sent on connections that use it (``conn.execute`` goes through here)."""

    statements: ClassVar[list[str]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> CountingCursor:  # type: ignore[override]
        CountingCursor.statements.append(str(query))
        await super().execute(query, params, **kwargs)
        return self


async def build_tree(db: Database, scope: Scope, levels: list[int]) -> tuple[Tree, list[uuid.UUID]]:
    """A root with ``levels[0]`` children, ``levels[1]`` grandchildren spread over them, and so on,
    made by direct repository calls; members get a mix of running, queued and idle states."""
    tree = await make_tree(db, scope, slot_limit=4)
    _, root_run = await start_run(db, scope, tree.tree_id, tree.root_id, "plan")
    await finish(db, root_run, output=SECRET_OUTPUT)
    members = [tree.root_id]
    async with db.tx() as conn:
        parents = [await sessions.get_session_row(conn, scope, tree.root_id)]
        for level, count in enumerate(levels, start=1):
            made = []
            for i in range(count):
                parent = parents[i % len(parents)]
                child = await sessions.create_child(
                    conn, parent, name=f"m{level}-{i}", agent_id=None, agent_config=AGENT_CONFIG,
                    max_depth=len(levels), max_members=10_000, created_by_run_id=root_run.run_id)
                made.append(await sessions.get_session_row(conn, scope, child["session_id"]))
            parents = made
            members.extend(row["session_id"] for row in made)
        for i, member in enumerate(members[1:]):
            for n in range(i % 3):  # 0: idle, 1: a started turn, 2: a started turn and a queued input
                await turns.submit_input(conn, scope, member, f"task {n}", HUMAN)
    return tree, members


async def counted_summary(database_url: str, scope: Scope, tree_id: uuid.UUID) -> tuple[Row, int]:
    conn = await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row, cursor_factory=CountingCursor)
    try:
        CountingCursor.statements.clear()
        summary = await trees.tree_summary(conn, scope, tree_id)  # type: ignore[arg-type]
        return summary, len(CountingCursor.statements)
    finally:
        await conn.close()


async def test_summary_of_107_members_takes_as_many_statements_as_7(db: Database, database_url: str,
                                                                     scope: Scope) -> None:
    small, small_members = await build_tree(db, scope, [2, 2, 2])
    big, big_members = await build_tree(db, scope, [6, 60, 40])
    assert (len(small_members), len(big_members)) == (7, 107)

    small_summary, small_statements = await counted_summary(database_url, scope, small.tree_id)
    big_summary, big_statements = await counted_summary(database_url, scope, big.tree_id)
    assert small_statements == big_statements <= 2

    assert {m["session_id"] for m in big_summary["members"]} == set(big_members)
    assert {m["session_id"] for m in small_summary["members"]} == set(small_members)
    assert (big_summary["slot_limit"], big_summary["slots_in_use"], big_summary["stopped"]) == (4, 0, False)
    for summary in (small_summary, big_summary):
        assert SECRET_OUTPUT not in repr(summary)
        for member in summary["members"]:
            assert "output" not in member and "agent_config" not in member
    by_path = {m["path"]: m for m in big_summary["members"]}
    root = by_path["/root"]
    assert (root["depth"], root["parent_id"], root["turn_status"], root["activity"]) == (0, None, "completed", "idle")
    assert by_path["/root/m1-0"]["activity"] == "idle"
    assert (by_path["/root/m1-1"]["activity"], by_path["/root/m1-1"]["pending_inputs"]) == ("queued", 0)
    assert (by_path["/root/m1-2"]["turn_status"], by_path["/root/m1-2"]["pending_inputs"]) == ("running", 1)
    assert max(m["depth"] for m in big_summary["members"]) == 3


async def test_summary_reports_slots_and_activity(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    async with db.tx() as conn:
        summary = await trees.tree_summary(conn, scope, tree.tree_id)
    by_path = {m["path"]: m for m in summary["members"]}
    assert summary["slots_in_use"] == 1
    assert by_path["/root"]["activity"] == "running" and by_path["/root"]["turn_id"] == run.turn_id
    assert by_path["/root/aaa"]["activity"] == "queued"
    assert by_path["/root/aaa"]["turn_id"] == uuid.UUID(aaa["turn_id"])


# --- stop and continue ----------------------------------------------------------------------------


async def stop(db: Database, scope: Scope, tree: Tree) -> list[uuid.UUID]:
    async with db.tx() as conn:
        return await trees.stop_tree(conn, scope, tree.tree_id)


async def resume(db: Database, scope: Scope, tree: Tree) -> list[uuid.UUID]:
    async with db.tx() as conn:
        return await trees.continue_tree(conn, scope, tree.tree_id)


async def test_stop_cancels_every_open_turn_and_pauses_pending_queues(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    bbb = await create_child(db, run, "bbb")
    bbb_run = await claim_turn(db, tree.tree_id, bbb["turn_id"])
    ccc = await create_child(db, run, "ccc")
    ccc_run = await claim_turn(db, tree.tree_id, ccc["turn_id"])
    queued = await create_child(db, run, "aaa")  # its Run waits for a slot (no grant after it)
    later = await submit(db, scope, uuid.UUID(queued["session_id"]), "aaa's next task")
    wait_id = await park(db, ccc_run, condition={"input_ids": [str(later["input_id"])]})

    signalled = await stop(db, scope, tree)
    assert set(signalled) == {tree.root_id, bbb_run.session_id}  # the live Runs
    assert (await fetch_one(db, "SELECT stopped FROM trees WHERE tree_id = %s", (tree.tree_id,)))["stopped"]
    assert (await turn_row(db, run.turn_id))["status"] == "cancelling"
    assert (await turn_row(db, bbb["turn_id"]))["status"] == "cancelling"
    assert (await turn_row(db, queued["turn_id"]))["status"] == "cancelled"
    assert (await turn_row(db, ccc["turn_id"]))["status"] == "cancelled"
    assert (await fetch_one(db, "SELECT status FROM waits WHERE wait_id = %s", (wait_id,)))["status"] == "cancelled"
    aaa = await session_row(db, queued["session_id"])
    assert aaa["queue_paused"] is True
    pending = await fetch_one(db, "SELECT status FROM inputs WHERE input_id = %s", (later["input_id"],))
    assert pending["status"] == "pending"  # kept, not started
    assert await fetch_all(db, "SELECT run_id FROM runs WHERE tree_id = %s AND status = 'pending'",
                           (tree.tree_id,)) == []

    before = await count_rows(db)
    with pytest.raises(Conflict, match="still cancelling"):
        await resume(db, scope, tree)
    assert await count_rows(db) == before

    await finish(db, run, "cancelled")
    await finish(db, bbb_run, "cancelled")
    started = await resume(db, scope, tree)
    assert started == [uuid.UUID(queued["session_id"])]
    assert not (await fetch_one(db, "SELECT stopped FROM trees WHERE tree_id = %s", (tree.tree_id,)))["stopped"]
    assert (await session_row(db, queued["session_id"]))["queue_paused"] is False
    new_turn = await fetch_one(db, "SELECT status FROM turns WHERE input_id = %s", (later["input_id"],))
    assert new_turn["status"] == "running"
    for turn_id in (run.turn_id, bbb["turn_id"], queued["turn_id"], ccc["turn_id"]):
        assert (await turn_row(db, turn_id))["status"] == "cancelled"  # cancelled Turns stay cancelled


async def test_a_stop_and_a_continue_serialise_and_the_continue_wins(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    later = await submit(db, scope, uuid.UUID(aaa["session_id"]), "next")
    await finish(db, run)

    async with db.tx() as conn:
        await trees.stop_tree(conn, scope, tree.tree_id)
        continuing = asyncio.create_task(resume(db, scope, tree))
        await asyncio.sleep(0.3)
        assert not continuing.done()  # waits for the stop's tree lock
    assert await continuing == [uuid.UUID(aaa["session_id"])]

    assert not (await fetch_one(db, "SELECT stopped FROM trees WHERE tree_id = %s", (tree.tree_id,)))["stopped"]
    assert (await session_row(db, aaa["session_id"]))["queue_paused"] is False
    assert (await fetch_one(db, "SELECT status FROM inputs WHERE input_id = %s", (later["input_id"],)))["status"] \
        == "consumed"
    kinds = await fetch_all(db, "SELECT kind FROM events WHERE tree_id = %s AND kind LIKE 'tree_%%' ORDER BY cursor",
                            (tree.tree_id,))
    assert [k["kind"] for k in kinds] == ["tree_stopped", "tree_continued"]


async def test_a_stop_racing_a_finishing_member_keeps_its_result(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])

    async with db.tx() as conn:
        await turns.finish_turn(conn, aaa_run, "completed", output="aaa finished first")
        stopping = asyncio.create_task(stop(db, scope, tree))
        await asyncio.sleep(0.3)
    signalled = await asyncio.wait_for(stopping, timeout=10)

    assert signalled == [tree.root_id]
    turn = await turn_row(db, aaa["turn_id"])
    assert (turn["status"], turn["result_run_id"]) == ("completed", aaa_run.run_id)
    async with db.tx() as conn:
        result = await turns.get_result(conn, scope, turn_id=aaa_run.turn_id)
    assert result["output"] == "aaa finished first" and result["error"] is None
    terminal = await fetch_all(db, "SELECT kind FROM events WHERE turn_id = %s AND kind LIKE 'turn_%%' "
                                   "AND kind <> 'turn_started'", (aaa_run.turn_id,))
    assert [e["kind"] for e in terminal] == ["turn_completed"]


async def test_a_stop_racing_a_member_that_holds_its_lock_does_not_deadlock(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])

    async with db.tx() as conn:
        await turns.lock_session(conn, scope, aaa_run.session_id)  # finish_turn's first statement
        stopping = asyncio.create_task(stop(db, scope, tree))
        await asyncio.sleep(0.3)
        await asyncio.wait_for(turns.finish_turn(conn, aaa_run, "completed", output="done"), timeout=5)
    assert await asyncio.wait_for(stopping, timeout=10) == [tree.root_id]
    assert (await turn_row(db, aaa["turn_id"]))["status"] == "completed"
    assert (await turn_row(db, run.turn_id))["status"] == "cancelling"


async def test_a_stop_racing_a_member_creating_a_session_stops_the_tree_and_the_new_member(
        db: Database, scope: Scope) -> None:
    """A member's step holds its own row and then inserts a session of the tree, whose foreign key
    shares the tree row: a stop holding that row exclusively (and waiting for the member) deadlocked,
    and PostgreSQL aborted the stop, so the tree ran on with its new member."""
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await turns.begin_tool_step(conn, run)
        stopping = asyncio.create_task(stop(db, scope, tree))
        await until_a_lock_is_awaited(db, STOP_LOCKING_MEMBERS)  # the stop holds the tree, waits for this member
        kid = await asyncio.wait_for(cooperation.create_session(
            conn, run, "c1", name="kid", description="x", limits=limits(), dispatcher=DISPATCHER), timeout=5)
    await asyncio.wait_for(stopping, timeout=10)
    assert (await fetch_one(db, "SELECT stopped FROM trees WHERE tree_id = %s", (tree.tree_id,)))["stopped"] is True
    assert (await turn_row(db, kid["turn_id"]))["status"] == "cancelled"


async def test_a_turn_stopped_while_it_waits_has_the_stop_as_its_results_error(db: Database, scope: Scope) -> None:
    """Its result Run is the Run that parked, which ended with no error of its own: the Result said
    ``cancelled`` with no error (a running Turn stopped alike says why)."""
    tree, run = await start_root_run(db, scope)
    child = await create_child(db, run, "aaa")
    await park(db, run, condition={"input_ids": [child["input_id"]]})
    await stop(db, scope, tree)
    async with db.tx() as conn:
        result = await turns.get_result(conn, scope, turn_id=run.turn_id)
    assert (result["status"], result["error"]) == ("cancelled", "stopped: the whole tree was stopped")


async def test_after_a_stop_a_human_input_unpauses_only_that_member(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    bbb = await create_child(db, run, "bbb")
    for child in (aaa, bbb):
        await submit(db, scope, uuid.UUID(child["session_id"]), "queued work")
    await finish(db, run)
    await stop(db, scope, tree)

    receipt = await submit(db, scope, uuid.UUID(aaa["session_id"]), "a human's new task")
    assert receipt["status"] == "queued"  # the older pending input goes first
    assert (await session_row(db, aaa["session_id"]))["queue_paused"] is False
    assert (await session_row(db, bbb["session_id"]))["queue_paused"] is True
    open_turns = await fetch_all(db, "SELECT session_id FROM turns WHERE status = 'running' AND session_id = ANY(%s)",
                                 ([uuid.UUID(aaa["session_id"]), uuid.UUID(bbb["session_id"])],))
    assert [t["session_id"] for t in open_turns] == [uuid.UUID(aaa["session_id"])]
    # A cooperating session's input does not unpause.
    async with db.tx() as conn:
        await turns.submit_input(conn, scope, uuid.UUID(bbb["session_id"]), "from a peer", {"kind": "session"})
    assert (await session_row(db, bbb["session_id"]))["queue_paused"] is True


async def test_a_stop_racing_a_resuming_wait_cancels_its_resume_run(db: Database, scope: Scope) -> None:
    """A wait resumed (its resume Run queued, its Turn running again) by a transaction that commits
    while Stop all runs: the stop cancels that Run with the Turn. It cancelled the Turn and left the
    resume Run pending, which a slot then ran: a model call in a tree the human had stopped."""
    tree, run = await start_root_run(db, scope)
    wait_id = await park(db, run, condition={"input_ids": []})  # met at once
    async with db.tx() as conn:
        assert await waits.try_resume(conn, wait_id) is not None
        stopping = asyncio.create_task(stop(db, scope, tree))
        await asyncio.sleep(0.3)
    await asyncio.wait_for(stopping, timeout=10)

    assert (await turn_row(db, run.turn_id))["status"] == "cancelled"
    assert await fetch_all(db, "SELECT run_id FROM runs WHERE turn_id = %s AND status IN ('pending', 'running')",
                           (run.turn_id,)) == []
    assert await grant(db, tree.tree_id) == []


async def test_a_cancel_racing_a_resuming_wait_does_not_deadlock(db: Database, scope: Scope) -> None:
    """Cancelling a waiting Turn locks the Turn, then its wait; resuming the wait locked the wait, then
    the Turn: at once, PostgreSQL aborted one of them (the API's cancel answered 500)."""
    tree, run = await start_root_run(db, scope)
    wait_id = await park(db, run, condition={"input_ids": []})
    async with db.tx() as conn:
        await conn.execute("SELECT 1 FROM turns WHERE turn_id = %s FOR NO KEY UPDATE", (run.turn_id,))
        resuming = asyncio.create_task(try_resume(db, wait_id))
        await asyncio.sleep(0.3)
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id) is False
    assert await asyncio.wait_for(resuming, timeout=10) is None

    assert (await turn_row(db, run.turn_id))["status"] == "cancelled"
    assert (await fetch_one(db, "SELECT status FROM waits WHERE wait_id = %s", (wait_id,)))["status"] == "cancelled"
    assert await fetch_all(db, "SELECT run_id FROM runs WHERE turn_id = %s AND kind = 'resume'", (run.turn_id,)) == []


@pytest.mark.parametrize("origin", [
    {"kind": "schedule"},
    {"kind": "session", "tree_id": str(uuid.uuid4())},  # another tree's session
])
async def test_after_a_stop_input_from_outside_to_a_member_still_cancelling_waits_for_continue(
        db: Database, scope: Scope, origin: dict[str, Any]) -> None:
    """The stop left the member's Turn cancelling (its Run was live) and its queue unpaused (nothing
    was pending): input from outside the tree meanwhile started a Turn once that Run ended."""
    tree, run = await start_root_run(db, scope)
    assert await stop(db, scope, tree) == [tree.root_id]
    async with db.tx() as conn:
        receipt = await turns.submit_input(conn, scope, tree.root_id, "tick", origin)
    await finish(db, run, "cancelled")

    assert receipt["status"] == "queued"
    assert (await session_row(db, tree.root_id))["queue_paused"] is True
    assert [t["status"] for t in await fetch_all(db, "SELECT status FROM turns WHERE session_id = %s",
                                                  (tree.root_id,))] == ["cancelled"]
    assert await resume(db, scope, tree) == [tree.root_id]
    assert (await fetch_one(db, "SELECT status FROM inputs WHERE input_id = %s", (receipt["input_id"],)))["status"] \
        == "consumed"


@pytest.mark.parametrize("origin", [
    {"kind": "schedule"},
    {"kind": "session", "tree_id": str(uuid.uuid4())},  # another tree's session
])
async def test_after_a_stop_input_from_outside_the_tree_waits_for_continue(db: Database, scope: Scope,
                                                                           origin: dict[str, Any]) -> None:
    """Stop all pauses the members with pending input. One given input later by a schedule or by
    another tree's session, while the tree was still stopped, started a Turn (and called the model)
    in a tree the human had stopped."""
    tree, run = await start_root_run(db, scope)
    await finish(db, run)
    await stop(db, scope, tree)
    assert (await session_row(db, tree.root_id))["queue_paused"] is False  # nothing was pending

    async with db.tx() as conn:
        receipt = await turns.submit_input(conn, scope, tree.root_id, "tick", origin)

    assert receipt["status"] == "queued"
    assert (await session_row(db, tree.root_id))["queue_paused"] is True
    assert len(await fetch_all(db, "SELECT turn_id FROM turns WHERE session_id = %s", (tree.root_id,))) == 1
    assert await resume(db, scope, tree) == [tree.root_id]
    assert (await fetch_one(db, "SELECT status FROM inputs WHERE input_id = %s", (receipt["input_id"],)))["status"] \
        == "consumed"


async def test_after_a_stop_a_member_a_human_set_going_delegates_within_the_tree(db: Database,
                                                                                    scope: Scope) -> None:
    """In a stopped tree only a human's input runs a member; what that member gives another member
    of the tree is the human's work too (paused, the member waiting on it would hold Continue off)."""
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])
    async with db.tx() as conn:
        await turns.finish_turn(conn, aaa_run, "completed", output="done")
    await finish(db, run)
    await stop(db, scope, tree)

    worked = await submit(db, scope, tree.root_id, "a human's new task")
    assert worked["status"] == "started"
    async with db.tx() as conn:
        given = await turns.submit_input(conn, scope, uuid.UUID(aaa["session_id"]), "delegated",
                                         {"kind": "session", "tree_id": str(tree.tree_id)})

    assert given["status"] == "started"
    assert (await session_row(db, aaa["session_id"]))["queue_paused"] is False


async def test_a_continue_racing_an_input_that_pauses_its_member_starts_it(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    await finish(db, run)
    await stop(db, scope, tree)

    async with db.tx() as conn:
        receipt = await turns.submit_input(conn, scope, tree.root_id, "tick", {"kind": "schedule"})
        continuing = asyncio.create_task(resume(db, scope, tree))
        await asyncio.sleep(0.3)  # the continue is under way, and waits for this transaction
    assert await continuing == [tree.root_id]

    assert (await session_row(db, tree.root_id))["queue_paused"] is False
    assert (await fetch_one(db, "SELECT status FROM inputs WHERE input_id = %s", (receipt["input_id"],)))["status"] \
        == "consumed"


# --- archive --------------------------------------------------------------------------------------


async def test_archive_is_refused_while_busy_and_deletes_nothing(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    before = await count_rows(db)
    with pytest.raises(Conflict):
        async with db.tx() as conn:
            await trees.archive_root(conn, scope, tree.root_id)
    with pytest.raises(InvalidArgument):
        async with db.tx() as conn:
            await trees.archive_root(conn, scope, uuid.UUID(aaa["session_id"]))
    assert await count_rows(db) == before

    await finish(db, run)
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])
    await finish(db, aaa_run)
    async with db.tx() as conn:
        await trees.archive_root(conn, scope, tree.root_id)
        listed = await sessions.list_roots(conn, scope, project_id=None, offset=0, limit=10)
        with_archived = await sessions.list_roots(conn, scope, project_id=None, offset=0, limit=10,
                                                  include_archived=True)
    assert tree.root_id not in [r["session_id"] for r in listed]
    assert tree.root_id in [r["session_id"] for r in with_archived]
    after = await count_rows(db)
    assert after["sessions"] == before["sessions"] and after["turns"] == before["turns"]
    rows = await fetch_all(db, "SELECT archived FROM sessions WHERE tree_id = %s", (tree.tree_id,))
    assert [r["archived"] for r in rows] == [True, True]
    with pytest.raises(Conflict, match="archived"):
        await submit(db, scope, tree.root_id, "more")


async def test_a_tree_is_not_archived_while_an_input_to_a_member_commits(db: Database, scope: Scope) -> None:
    """The archive locked the tree and its root only: an input being given to another member at that
    moment (by a model of another tree) was not seen, the member read idle, and the tree archived with
    a Turn about to run in it, which Stop all then refuses to touch. The archive waits for the input
    now, sees the member busy, and is refused."""
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    await finish(db, run)
    await finish(db, await claim_turn(db, tree.tree_id, aaa["turn_id"]))
    given, release = asyncio.Event(), asyncio.Event()

    async def give() -> None:
        async with db.tx() as conn:
            await turns.submit_input(conn, scope, uuid.UUID(aaa["session_id"]), "more",
                                     {"kind": "session", "tree_id": str(uuid.uuid4())})
            given.set()
            await release.wait()  # holds the input open while the archive reads the tree

    async def archive() -> None:
        async with db.tx() as conn:
            await trees.archive_root(conn, scope, tree.root_id)

    giving = asyncio.create_task(give())
    await given.wait()
    archiving = asyncio.create_task(archive())
    await asyncio.sleep(1.0)  # the archive reads the members meanwhile
    release.set()
    await giving
    with pytest.raises(Conflict, match="/root/aaa is"):
        await archiving
    assert (await session_row(db, tree.root_id))["archived"] is False


async def test_archiving_an_archived_tree_writes_nothing(db: Database, scope: Scope) -> None:
    """As stop and continue of an archived tree do: a second archive appended another
    ``tree_archived`` event (a stream that had ended at the first found more after it) and touched
    every member."""
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        await trees.archive_root(conn, scope, tree.root_id)
    written = await count_rows(db), await fetch_all(db, "SELECT updated_at FROM sessions WHERE tree_id = %s",
                                                    (tree.tree_id,))
    async with db.tx() as conn:
        await trees.archive_root(conn, scope, tree.root_id)
    assert (await count_rows(db), await fetch_all(db, "SELECT updated_at FROM sessions WHERE tree_id = %s",
                                                  (tree.tree_id,))) == written


async def test_archive_and_stop_queued_behind_a_tree_lock_do_not_deadlock(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    await finish(db, run)

    async def archive() -> None:
        async with db.tx() as conn:
            await trees.archive_root(conn, scope, tree.root_id)

    async with db.tx() as conn:
        await runs.grant_slots(conn, tree.tree_id, 30)  # holds the tree lock, as a supervisor's grant does
        stopping = asyncio.create_task(stop(db, scope, tree))
        await asyncio.sleep(0.2)
        archiving = asyncio.create_task(archive())
        await asyncio.sleep(0.2)
    await asyncio.wait_for(asyncio.gather(stopping, archiving), timeout=10)
    row = await fetch_one(db, "SELECT stopped, archived FROM trees WHERE tree_id = %s", (tree.tree_id,))
    assert row == {"stopped": True, "archived": True}
