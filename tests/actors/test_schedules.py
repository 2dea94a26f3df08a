"""Scheduled inputs through the runtime: the sweeper fires each due time once and the session works it."""

from __future__ import annotations

import asyncio
import os
import signal

import ray
from ray.util.state import list_actors

from actors.naming import SWEEPER_NAME
from actors.runtime import Runtime
from actors.scripted import say, script
from persistence.databases import rows
from persistence.records import Scope
from persistence.schedules import Rule
from tests.actors.helpers import eventually


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
