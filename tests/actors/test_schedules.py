"""Scheduled inputs through the runtime: the sweeper fires each due time once, sharing a round among
the schedules due, and the session works it."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import ray
from ray.util.state import list_actors

from actors.naming import SWEEPER_NAME
from actors.runtime import Runtime
from actors.scripted import say, script
from actors.sweeper import fire_in_turns
from persistence import schedules
from persistence.databases import rows
from persistence.db import Database
from persistence.records import Scope
from persistence.schedules import Rule
from tests.actors.helpers import eventually
from tests.persistence.helpers import fetch_all, start_root_run


async def test_an_interval_schedule_gives_one_input_per_due_time(runtime: Runtime, scope: Scope) -> None:
    created = await runtime.create_root(scope, title="scheduled")
    session_id = created["session"]["session_id"]
    schedule = await runtime.create_schedule(scope, session_id, Rule(interval_seconds=1), script(say("tick")))

    async def fired_three() -> list[dict[str, object]]:
        found = await rows(runtime.db, "SELECT i.origin, t.status FROM inputs i LEFT JOIN turns t USING (input_id) "
                           "WHERE i.session_id = %s ORDER BY i.seq", session_id)
        return found if len(found) >= 3 and all(r["status"] == "completed" for r in found[:3]) else []

    await eventually(fired_three, timeout=60)
    await runtime.delete_schedule(scope, session_id, schedule["schedule_id"])
    await asyncio.sleep(2)  # a deleted schedule fires no more
    inputs = await rows(runtime.db, "SELECT origin FROM inputs WHERE session_id = %s ORDER BY seq", session_id)
    firings = await rows(runtime.db, "SELECT due_at, input_id, error FROM schedule_firings WHERE schedule_id = %s "
                         "ORDER BY due_at", schedule["schedule_id"])
    assert [i["origin"]["kind"] for i in inputs] == ["schedule"] * len(inputs)
    given = [f for f in firings if f["input_id"] is not None]
    assert len(given) == len(inputs) >= 3
    assert len({f["due_at"] for f in firings}) == len(firings)  # one firing per due time
    # A due time that came while the last input still waited (a slow host) gave none, and says why.
    assert all("still waits" in f["error"] for f in firings if f["input_id"] is None)
    results = await rows(runtime.db, "SELECT r.output FROM turns t JOIN runs r ON r.run_id = t.result_run_id "
                         "WHERE t.session_id = %s", session_id)
    assert {r["output"] for r in results} == {"tick"}


async def test_a_sweeper_killed_and_restarted_by_ray_goes_on_sweeping(runtime: Runtime, scope: Scope) -> None:
    """Ray restarts a lost sweeper by running its constructor again; only a sweeper fires schedules,
    so a schedule that keeps firing after the kill proves the restarted one sweeps."""
    def sweeper_pid() -> int | None:
        alive = list_actors(address=ray.get_runtime_context().gcs_address,
                            filters=[("name", "=", SWEEPER_NAME), ("state", "=", "ALIVE")])
        return int(alive[0].pid) if alive else None

    killed = await asyncio.to_thread(sweeper_pid)
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    created = await runtime.create_root(scope, title="scheduled after a sweeper's death")
    session_id = created["session"]["session_id"]
    schedule = await runtime.create_schedule(scope, session_id, Rule(interval_seconds=1), script(say("tick")))

    async def fired_twice() -> bool:
        found = await rows(runtime.db, "SELECT 1 FROM schedule_firings WHERE schedule_id = %s",
                           schedule["schedule_id"])
        return len(found) >= 2

    await eventually(fired_twice, timeout=90)
    await runtime.delete_schedule(scope, session_id, schedule["schedule_id"])
    assert await asyncio.to_thread(sweeper_pid) not in (None, killed)  # another process sweeps now


async def test_a_round_shares_its_firings_among_the_schedules_catching_up(db: Database, scope: Scope) -> None:
    """Schedules catching up on all their missed due times fired up to 20 each in one round: a
    backlog of 100 held the round (and the recoveries behind it) for 2,000 transactions. A round
    fires at most its budget, one due time of each schedule in turn."""
    made, roots = [], []
    for _ in range(3):
        tree, _busy = await start_root_run(db, scope)  # a running Turn: each input waits in the queue
        async with db.tx() as conn:
            schedule = await schedules.create_schedule(conn, scope, tree.root_id, Rule(interval_seconds=10),
                                                       "tick", "all")
            await conn.execute("UPDATE schedules SET next_due_at = now() - interval '95 seconds' "
                               "WHERE schedule_id = %s", (schedule["schedule_id"],))  # ten due times missed
        made.append(schedule["schedule_id"])
        roots.append(tree.root_id)

    async def fire(schedule_id: uuid.UUID) -> bool:
        async with db.tx() as conn:
            return await schedules.fire_due(conn, schedule_id) is not None

    async def firings() -> list[int]:
        counted = await fetch_all(db, "SELECT schedule_id, count(*) AS n FROM schedule_firings "
                                  "WHERE schedule_id = ANY(%s) GROUP BY schedule_id", (made,))
        return sorted(row["n"] for row in counted)

    await fire_in_turns(made, 7, fire)
    assert await firings() == [2, 2, 3]
    await fire_in_turns(made, 100, fire)  # a larger budget: every schedule catches up, then none fires
    assert await firings() == [10, 10, 10]
    async with db.tx() as conn:  # due again each 10 s: out of the due list the other tests read
        for root_id, schedule_id in zip(roots, made, strict=True):
            await schedules.delete_schedule(conn, scope, root_id, schedule_id)
