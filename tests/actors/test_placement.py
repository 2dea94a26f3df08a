"""Where sessions and tree supervisors run (actors/placement.py), read back from Ray's own state:
a dedicated actor per session and per tree, or tasks named ``session:<id>`` inside the shared
hosts with the tree's supervisor there too. What both shapes must do alike (cooperation, slots,
kills, passivation) is every other test of tests/actors, which runs against both."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util.state import list_actors, list_tasks

from actors.hosting import SHAPE_ACTORS
from actors.naming import NAMESPACE, host_actor_name
from actors.placement import Dedicated, Hosted, choose
from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.databases import create_database, drop_database
from persistence.records import Scope
from persistence.settings import Settings
from tests.actors.helpers import (
    a_root_in_host,
    eventually,
    freed_only_by_the_loop,
    peak_concurrent_runs,
    rows,
    scenario_findings,
)
from tests.conftest import RUNTIME_ENV


def test_the_settings_choose_the_shape() -> None:
    assert isinstance(choose(Settings(session_hosts=0), SHAPE_ACTORS), Dedicated)
    hosted = choose(Settings(session_hosts=3), SHAPE_ACTORS)
    assert isinstance(hosted, Hosted) and hosted.hosts == 3
    session_id = uuid.uuid4()
    assert hosted.host_index(session_id) == session_id.int % 3  # stable: a session never runs in two hosts


async def test_a_fan_out_runs_where_the_placement_puts_it(runtime: Runtime, scope: Scope) -> None:
    children = 6
    text = script(call(*(create(f"h{i}", script(say(f"h{i} done", delay_ms=400))) for i in range(children))),
                  call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(children)]})),
                  say("fan-out done"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    address = ray.get_runtime_context().gcs_address
    actors_seen: set[str] = set()
    tasks_seen: set[str] = set()

    async def watch() -> None:
        while True:
            actors = await asyncio.to_thread(list_actors, address=address, filters=[("state", "=", "ALIVE")],
                                             limit=10_000)
            actors_seen.update(a.name for a in actors if a.name)
            tasks = await asyncio.to_thread(list_tasks, address=address, filters=[("state", "=", "RUNNING")],
                                            limit=10_000)
            tasks_seen.update(t.name for t in tasks if t.name.startswith("session:"))
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    try:
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
    finally:
        watcher.cancel()
    assert (result["status"], result["output"]) == ("completed", "fan-out done")
    assert await peak_concurrent_runs(runtime.db, tree_id) == 4
    members = {f"session:{m['session_id']}"
               for m in await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s", tree_id)}
    session_actors = {name for name in actors_seen if name.startswith("session:")}
    hosts = sorted(name for name in actors_seen if name.startswith("canopy:sessions:"))
    if isinstance(runtime.placement, Hosted):
        assert session_actors == set()  # no process per session...
        assert hosts == ["canopy:sessions:0", "canopy:sessions:1"]  # ...two hosts for all of them
        assert tasks_seen & members  # the dashboard shows the sessions as tasks named session:<id>
        assert f"tree:{tree_id}" not in actors_seen  # the supervisor runs in the root's host
        status: dict[str, Any] = await runtime.placement.supervisor_actor(tree_id).status.remote()
        assert status["index"] == runtime.placement.host_index(tree_id)
    else:
        assert session_actors & members  # an actor per active session...
        assert f"tree:{tree_id}" in actors_seen  # ...and per active tree supervisor
        assert hosts == []


async def drains_again_in(index: int) -> float:
    """Seconds before host ``index`` may drain again, as it says (0 when it has not been made)."""
    try:
        host = ray.get_actor(host_actor_name(index), namespace=NAMESPACE)
    except ValueError:
        return 0.0
    return float((await host.status.remote())["drains_again_in"])


async def test_a_slow_lookup_of_a_sessions_actor_holds_up_nothing_else_of_its_caller(
        runtime: Runtime, scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    """Getting or making a session's actor (or its host) by name is a call to Ray's GCS, which can
    take seconds (a GCS under load or restarting). Made on the caller's event loop (a session
    host's: every session's lease renewals and model calls) it held that loop as long: here the
    loop must run while the lookup of an activation is under way, and the activation then land."""
    created = await runtime.create_root(scope, input_text=script(say("first")))
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "first"
    session_id = created["session"]["session_id"]
    handles = runtime.placement._session_target(session_id).handles
    make = handles._create
    async with freed_only_by_the_loop() as (hold, held):

        def slow_make(key: Any) -> Any:
            hold()
            return make(key)

        monkeypatch.setattr(handles, "_create", slow_make)
        handles._cache.clear()  # this process's handles, so that the activation looks its actor up
        await runtime.placement.activate(session_id)
    assert held and all(held), held  # asked again if the actor passivated meanwhile
    # The handle it made reaches the session: a second input is answered.
    second = await runtime.submit_input(scope, session_id, script(say("second")))
    assert (await runtime.wait_result(scope, second["input_id"], timeout=60))["output"] == "second"


async def test_a_moving_host_drains_between_runs_and_gives_up_past_its_limit(runtime: Runtime, scope: Scope) -> None:
    """A host asked to move to another node (here one no node has) drains: its busy session's Run goes
    on, and no Run of another session of that host begins meanwhile. Past
    host_drain_seconds (3 s in tests) with the Run still going, the host gives up and stays, the work
    that waited runs in it, and asking again does not drain it again at once."""
    if not isinstance(runtime.placement, Hosted):
        pytest.skip("hosts are the hosted shape's")
    # The busy Turn outlasts the drain's 3 s by far, however slowly the test reaches the move.
    busy = await runtime.create_root(scope, input_text=script(say("busy done", delay_ms=12_000)))
    index = runtime.placement.host_index(busy["session"]["session_id"])
    host = runtime.placement.session_actor(busy["session"]["session_id"])

    async def busy_turn() -> Any:
        return ((await runtime.placement.session_status(busy["session"]["session_id"])) or {}).get("turn_id")

    await eventually(busy_turn)
    before = await host.status.remote()
    [clock] = await rows(runtime.db, "SELECT clock_timestamp() AS now")

    assert await host.move.remote("f" * 56) is False  # draining: a Run is in progress
    assert (await host.status.remote())["moving"]
    waited = await a_root_in_host(runtime, scope, index, script(say("waited")))

    results = [await runtime.wait_result(scope, created["input"]["input_id"], timeout=60) for created in (waited, busy)]
    assert [(r["status"], r["output"]) for r in results] == [("completed", "waited"), ("completed", "busy done")]
    [waited_run] = await rows(runtime.db, "SELECT ended_at FROM runs WHERE session_id = %s",
                              waited["session"]["session_id"])
    # It began no Run while the host drained: it waited for the drain to give up.
    assert (waited_run["ended_at"] - clock["now"]).total_seconds() >= 3
    [busy_run] = await rows(runtime.db, "SELECT status FROM runs WHERE session_id = %s",
                            busy["session"]["session_id"])
    assert busy_run["status"] == "completed"  # ran once, never cut off
    after = await host.status.remote()
    assert after["pid"] == before["pid"] and not after["moving"]  # the host stayed, open again
    assert after["drains_again_in"] > 0
    assert await host.move.remote("f" * 56) is False and not (await host.status.remote())["moving"]


async def test_a_run_granted_while_its_host_drains_longer_than_a_lease_is_not_recovered(
        database_url: str, tmp_path: Path) -> None:
    """With the defaults a drain (60 s) outlasts a lease (30 s): a Run granted to a session whose
    host drains, refused there (it waits for the drain), had its lease run out, and the sweep
    recovered it as if its owner had died, counting towards the five recoveries after which a Turn
    fails; a Turn queued through a few drains failed without ever running. The host that refuses
    it holds its lease for the drain, as a Run handed back is held. A runtime of its own: see
    drain_scenario.py."""
    scratch = create_database(database_url, "canopy_drain")
    try:
        findings = await scenario_findings("tests.actors.drain_scenario", {
            **RUNTIME_ENV, "CANOPY_SESSION_HOSTS": "2", "CANOPY_LEASE_SECONDS": "3",
            "CANOPY_HEARTBEAT_SECONDS": "0.5", "CANOPY_HOST_DRAIN_SECONDS": "10",
            "CANOPY_DATABASE_URL": scratch, "CANOPY_DATA_DIR": str(tmp_path / "data")}, timeout=300)
    finally:
        drop_database(scratch)
    assert findings["moved"] is False, findings  # draining: the busy Run went on
    assert findings["results"] == [["completed", "waited"], ["completed", "busy done"]], findings
    assert findings["waited_runs"] == [["completed", False]], findings


async def test_a_moving_host_hands_a_long_run_on_between_model_steps(runtime: Runtime, scope: Scope) -> None:
    """A Run of many short model steps that lasts longer than host_drain_seconds (3 s in tests) does
    not keep its host from moving: at its next model boundary the Run is handed back (still running,
    its slot held, owned by nobody) and the session's next incarnation, in the host made again, goes
    on from the committed history. One Run, two owners; every message sent once; the host a new
    process."""
    if not isinstance(runtime.placement, Hosted):
        pytest.skip("hosts are the hosted shape's")
    steps = 8
    text = script(call(create("inbox", script(say("inbox done")))),
                  *(call(("send_message", {"target": "${0.session_id}", "text": f"m{i}"}), delay_ms=700)
                    for i in range(steps)),
                  say("busy done"))
    placement = runtime.placement

    async def quiet_hosts() -> list[int]:
        """Hosts whose drain would wait for nothing but this test's Run: not one whose drain gave up
        in an earlier test (it would not drain again for a while), nor one with another tree's Run."""
        running = await rows(runtime.db, "SELECT session_id FROM runs WHERE status = 'running'")
        busy_hosts = {placement.host_index(run["session_id"]) for run in running}
        return [index for index in range(placement.hosts)
                if index not in busy_hosts and await drains_again_in(index) == 0]

    busy = await a_root_in_host(runtime, scope, (await eventually(quiet_hosts, timeout=120, every=0.5))[0], text)
    session_id = busy["session"]["session_id"]
    host = runtime.placement.session_actor(session_id)

    async def owner_while_sending() -> Any:
        sent = await rows(runtime.db, "SELECT count(*) AS n FROM coop_messages WHERE sender_session_id = %s",
                          session_id)
        owned = await rows(runtime.db, "SELECT owner FROM runs WHERE session_id = %s AND owner IS NOT NULL "
                           "AND status = 'running'", session_id)
        return owned[0]["owner"] if sent[0]["n"] >= 1 and owned else None

    first_owner = await eventually(owner_while_sending)
    before = await host.status.remote()
    try:
        await host.move.remote("f" * 56)  # no node has that id: the host leaves and is made again where it was
    except ray.exceptions.RayActorError:
        pass  # it drained at once and exited before its reply left

    async def made_again() -> bool:
        try:
            return (await runtime.placement.session_actor(session_id).status.remote())["pid"] != before["pid"]
        except (ValueError, ray.exceptions.RayActorError):
            return False  # leaving, or not made again yet

    await eventually(made_again, timeout=30, every=0.3)  # the Run's steps go on far past the 3 s

    result = await runtime.wait_result(scope, busy["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "busy done")
    [run] = await rows(runtime.db, "SELECT status, error, owner FROM runs WHERE session_id = %s", session_id)
    assert (run["status"], run["error"]) == ("completed", None)  # one Run, never recovered...
    assert run["owner"] != first_owner  # ...ended by the session's next incarnation
    sent = await rows(runtime.db, "SELECT body FROM coop_messages WHERE sender_session_id = %s ORDER BY received_at",
                      session_id)
    assert [m["body"] for m in sent] == [f"m{i}" for i in range(steps)]  # none repeated, none lost
