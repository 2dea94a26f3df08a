"""Property: whatever the sequence of submits, grants, finishes, waits, resumes and lease losses,
a tree never holds more running Runs than its slots, and every grant takes the oldest pending Runs."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistence import runs, sessions, turns, waits
from persistence.db import Database
from persistence.records import RunRef, Scope
from tests.persistence.helpers import AGENT_CONFIG, HUMAN, LEASE_SECONDS, fetch_all, make_tree, new_owner

OPS = st.lists(
    st.tuples(st.sampled_from(["submit", "grant", "finish", "park", "resume", "expire"]), st.integers(0, 20)),
    min_size=1, max_size=25,
)


async def _runs_by_status(db: Database, tree_id: uuid.UUID) -> dict[str, list[dict[str, object]]]:
    rows = await fetch_all(db, "SELECT run_id, status, queued_at FROM runs WHERE tree_id = %s ORDER BY queued_at, "
                               "run_id", (tree_id,))
    by_status: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        by_status.setdefault(row["status"], []).append(row)
    return by_status


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slot_limit=st.integers(1, 3), ops=OPS)
async def test_slot_limit_and_fifo_hold_under_any_sequence(db: Database, slot_limit: int,
                                                           ops: list[tuple[str, int]]) -> None:
    scope = Scope(f"prop-{uuid.uuid4().hex[:8]}", "prop")
    tree = await make_tree(db, scope, slot_limit=slot_limit)
    async with db.tx() as conn:  # three children made directly, so no slot is used to create them
        creator = await turns.submit_input(conn, scope, tree.root_id, "plan", HUMAN)
        cur = await conn.execute("SELECT run_id FROM runs WHERE turn_id = %s", (creator["turn_id"],))
        creator_run = (await cur.fetchone() or {})["run_id"]
        root = await sessions.get_session_row(conn, scope, tree.root_id)
        members = [tree.root_id]
        for name in ("a", "b", "c"):
            child = await sessions.create_child(conn, root, name=name, agent_id=None, agent_config=AGENT_CONFIG,
                                                max_depth=2, max_members=10, created_by_run_id=creator_run)
            members.append(child["session_id"])
    live: list[RunRef] = []
    open_waits: list[uuid.UUID] = []

    for op, k in ops:
        before = await _runs_by_status(db, tree.tree_id)
        async with db.tx() as conn:
            if op == "submit":
                await turns.submit_input(conn, scope, members[k % len(members)], f"task {k}", HUMAN)
            elif op == "grant":
                granted = [row["run_id"] for row in await runs.grant_slots(conn, tree.tree_id, LEASE_SECONDS)]
                free = slot_limit - len(before.get("running", []))
                oldest = [row["run_id"] for row in before.get("pending", [])][:max(free, 0)]
                assert granted == oldest  # FIFO, and exactly the free slots
                for run_id in granted:
                    run = await runs.acquire_run(conn, run_id, new_owner(), LEASE_SECONDS)
                    assert run is not None
                    live.append(run)
            elif op == "finish" and live:
                await turns.finish_turn(conn, live.pop(k % len(live)), "completed", output=f"out {k}")
            elif op == "park" and live:
                open_waits.append(await waits.park(conn, live.pop(k % len(live)), tool_call_id=f"w{k}",
                                                   kind="inputs", condition={"input_ids": []}, timeout_seconds=60))
            elif op == "resume" and open_waits:
                assert await waits.try_resume(conn, open_waits.pop(k % len(open_waits))) is not None
            elif op == "expire" and live:
                run = live.pop(k % len(live))
                await conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' "
                                   "WHERE run_id = %s", (run.run_id,))
                assert await turns.recover_expired_run(conn, run.run_id) is not None
        after = await _runs_by_status(db, tree.tree_id)
        assert len(after.get("running", [])) <= slot_limit
        assert len(after.get("running", [])) == len(live)
