"""Wait-for deadlock detection: a wait that would close a cycle is refused at once with its path;
diamonds, waits on ended inputs and any-of waits with a way out are not; two Turns closing the
same cycle at the same moment: exactly one is refused."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from persistence import cooperation, deadlocks, waits
from persistence.db import Database
from persistence.errors import Deadlock
from persistence.records import RunRef, Scope
from tests.persistence.helpers import (
    DISPATCHER,
    child_run,
    count_rows,
    finish,
    make_tree,
    start_root_run,
    start_run,
)


async def _wait(db: Database, run: RunRef, label: str, *, inputs: list[Any] | None = None,
                sessions: list[uuid.UUID] | None = None) -> None:
    """Check the wait, then park the Run on it, in one transaction (as the wait tools do)."""
    input_ids = [uuid.UUID(str(i)) for i in inputs] if inputs is not None else None
    async with db.tx() as conn:
        await deadlocks.check_wait(conn, run, label, input_ids=input_ids, session_ids=sessions)
        if input_ids is not None:
            kind, condition = "inputs", {"input_ids": [str(i) for i in input_ids]}
        else:
            kind, condition = "sessions", {"targets": [str(s) for s in sessions or []], "after_cursor": 0}
        await waits.park(conn, run, tool_call_id=f"wait-{uuid.uuid4().hex[:6]}", kind=kind, condition=condition,
                         timeout_seconds=300, targets=[])


async def _refused(db: Database, run: RunRef, label: str, **targets: Any) -> list[str]:
    before = await count_rows(db)
    with pytest.raises(Deadlock) as caught:
        await _wait(db, run, label, **targets)
    assert await count_rows(db) == before  # nothing was written
    assert "waiting would deadlock" in str(caught.value)
    return caught.value.cycle


async def test_a_two_cycle_is_refused_with_its_path(db: Database, scope: Scope) -> None:
    _, root = await start_root_run(db, scope)
    child, child_run_ = await child_run(db, root, "c")
    root_input = (await _input_of(db, root))
    await _wait(db, root, "/root", inputs=[child["input_id"]])  # the child still runs: fine
    assert await _refused(db, child_run_, "/root/c", inputs=[root_input]) == ["/root/c", "/root", "/root/c"]


async def test_a_three_cycle_across_two_trees_is_refused(db: Database, scope: Scope) -> None:
    _, a = await start_root_run(db, scope)
    _, a1 = await child_run(db, a, "a1")
    tree_b, b = await start_root_run(db, scope)
    await _wait(db, a, "/root", inputs=[await _input_of(db, b)])
    await _wait(db, b, "/root", inputs=[await _input_of(db, a1)])
    cycle = await _refused(db, a1, "/root/a1", inputs=[await _input_of(db, a)])
    b_name = f"/root (tree {str(tree_b.tree_id)[:8]})"
    assert cycle == ["/root/a1", "/root", b_name, "/root/a1"]


async def test_waiting_for_an_input_queued_behind_ones_own_turn_is_refused(db: Database, scope: Scope) -> None:
    _, root = await start_root_run(db, scope)
    async with db.tx() as conn:
        queued = await cooperation.submit_input(conn, root, "s1", target="/root", text="later", dispatcher=DISPATCHER)
    assert queued["status"] == "queued"
    assert await _refused(db, root, "/root", inputs=[queued["input_id"]]) == ["/root", "/root"]


async def test_a_child_waiting_for_its_input_to_its_waiting_parent_is_refused(db: Database, scope: Scope) -> None:
    # The FIFO edge: the input is queued behind the parent's open Turn, which waits for the child.
    _, root = await start_root_run(db, scope)
    child, child_run_ = await child_run(db, root, "c")
    await _wait(db, root, "/root", inputs=[child["input_id"]])
    async with db.tx() as conn:
        queued = await cooperation.submit_input(conn, child_run_, "s1", target="/root", text="help",
                                                dispatcher=DISPATCHER)
    assert queued["status"] == "queued"
    assert await _refused(db, child_run_, "/root/c", inputs=[queued["input_id"]]) == ["/root/c", "/root", "/root/c"]


async def test_a_diamond_and_ended_inputs_are_not_deadlocks(db: Database, scope: Scope) -> None:
    _, root = await start_root_run(db, scope, slot_limit=8)
    a, a_run = await child_run(db, root, "a")
    b, b_run = await child_run(db, root, "b")
    d, d_run = await child_run(db, root, "d")
    done, done_run = await child_run(db, root, "done")
    await finish(db, done_run, output="ended")
    await _wait(db, a_run, "/root/a", inputs=[d["input_id"]])
    await _wait(db, b_run, "/root/b", inputs=[d["input_id"]])
    await _wait(db, root, "/root", inputs=[a["input_id"], b["input_id"], done["input_id"]])  # d still runs
    # d may now even wait on a session that has ended work: no cycle through an ended input.
    await _wait(db, d_run, "/root/d", inputs=[done["input_id"]])


async def test_an_any_of_wait_is_stuck_only_when_every_target_is(db: Database, scope: Scope) -> None:
    _, root = await start_root_run(db, scope)
    a, a_run = await child_run(db, root, "a")
    b, b_run = await child_run(db, root, "b")
    root_input = await _input_of(db, root)
    await _wait(db, root, "/root", sessions=[a["session_id"], b["session_id"]])
    await _wait(db, a_run, "/root/a", inputs=[root_input])  # b still runs: the root may yet resume
    assert await _refused(db, b_run, "/root/b", inputs=[root_input]) == ["/root/b", "/root", "/root/b"]


async def test_two_turns_closing_one_cycle_at_once_exactly_one_is_refused(db: Database, scope: Scope) -> None:
    for _ in range(50):
        tree = await make_tree(db, scope)
        first, a = await start_run(db, scope, tree.tree_id, tree.root_id)
        child, b = await child_run(db, a, f"c{uuid.uuid4().hex[:6]}")
        outcomes = await asyncio.gather(_wait(db, a, "/root", inputs=[child["input_id"]]),
                                        _wait(db, b, "/root/c", inputs=[first["input_id"]]),
                                        return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, Deadlock)]
        assert len(refused) == 1 and sum(o is None for o in outcomes) == 1, outcomes


async def _input_of(db: Database, run: RunRef) -> uuid.UUID:
    async with db.tx() as conn:
        cur = await conn.execute("SELECT input_id FROM turns WHERE turn_id = %s", (run.turn_id,))
        row = await cur.fetchone()
    assert row is not None
    return row["input_id"]
