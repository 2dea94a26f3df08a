"""Helpers for the actor tests: reads of durable facts, polling, where the placement runs a
session (killing its process, counting live sessions), and a database error at one write."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.state import list_actors

from actors.gateways import gateway_on
from actors.naming import NAMESPACE, host_actor_name, sandbox_host_name
from actors.placement import Hosted
from actors.runtime import Runtime
from persistence.databases import rows
from persistence.db import Database
from persistence.records import Scope


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 60.0, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(every)


async def peak_concurrent_runs(db: Database, tree_id: uuid.UUID) -> int:
    """The most Runs of the tree that held a slot at one instant, from recorded start/end times."""
    intervals = await rows(db, "SELECT started_at, ended_at FROM runs WHERE tree_id = %s AND started_at IS NOT NULL",
                           tree_id)
    points = sorted([(r["started_at"], 1) for r in intervals] +
                    [(r["ended_at"], -1) for r in intervals if r["ended_at"] is not None],
                    key=lambda p: (p[0], p[1]))  # an end at the same instant frees before a start
    peak = current = 0
    for _, delta in points:
        current += delta
        peak = max(peak, current)
    return peak


async def session_id_at(db: Database, tree_id: uuid.UUID, path: str) -> uuid.UUID:
    found = await rows(db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = %s", tree_id, path)
    return found[0]["session_id"]


async def kill_session_process(runtime: Runtime, session_id: uuid.UUID, how: str) -> None:
    """Kill the process that runs the session (its own actor, or its shared host: the host's
    other sessions die with it) by ``ray.kill`` or ``kill -9``."""
    if how == "ray.kill":
        ray.kill(runtime.placement.session_actor(session_id), no_restart=True)
        return
    status = await runtime.placement.session_status(session_id)
    assert status is not None, f"session {session_id} is not live"
    os.kill(int(status["pid"]), signal.SIGKILL)


def model_gateway() -> Any:
    """This node's model gateway as it is now, where this node's sessions' calls go: looked up by
    name, as an earlier test may have killed the one a cached handle names."""
    return gateway_on(ray.get_runtime_context().get_node_id())


async def model_calls_waiting(delay_seconds: float) -> int:
    """Requests of that simulated latency the node's scripted model is waiting out: a test's own
    calls, told apart from other tests' by a latency of their own."""
    return (await model_gateway().scripted_waiting.remote()).get(delay_seconds, 0)


async def live_sessions(runtime: Runtime) -> int:
    """Sessions live right now, counted where they run: ``session:<id>`` actors, or sessions inside
    the shared hosts."""
    placement = runtime.placement
    if isinstance(placement, Hosted):
        hosts = [ray.get_actor(host_actor_name(index), namespace=NAMESPACE) for index in range(placement.hosts)]
        return sum(status["sessions"] for status in await asyncio.gather(*(h.status.remote() for h in hosts)))
    # The cluster's own address: other Ray clusters may run on the same machine.
    alive = await asyncio.to_thread(list_actors, address=ray.get_runtime_context().gcs_address,
                                    filters=[("state", "=", "ALIVE")], limit=10_000)
    return sum(1 for actor in alive if (actor.name or "").startswith("session:"))


async def alive_sandbox_hosts() -> list[Any]:
    """This node's sandbox host as Ray's actor table has it (its pid, its node), if it is alive."""
    node_id = ray.get_runtime_context().get_node_id()
    return await asyncio.to_thread(list_actors, address=ray.get_runtime_context().gcs_address,
                                   filters=[("name", "=", sandbox_host_name(node_id)), ("state", "=", "ALIVE")])


REPO = Path(__file__).resolve().parents[2]


async def scenario_findings(module: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run a scenario script (``python -m module``) in a Ray cluster of its own, not the test
    session's, and return the findings it prints as its last ``FINDINGS {json}`` line."""
    env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", module, env=env, cwd=REPO,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    except TimeoutError:
        proc.kill()
        raise
    text = out.decode(errors="replace")
    found = [line for line in text.splitlines() if line.startswith("FINDINGS ")]
    assert found, text[-4000:]
    return json.loads(found[-1].removeprefix("FINDINGS "))


def ray_prometheus_text() -> str:
    """Every live node's metrics agent export, in Prometheus text (Ray prefixes application metrics
    with ``ray_``)."""
    texts = []
    for node in ray.nodes():
        if node["Alive"]:
            url = f"http://127.0.0.1:{node['MetricsExportPort']}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                texts.append(response.read().decode())
    return "\n".join(texts)


@contextlib.asynccontextmanager
async def failing_once(db: Database, table: str, when: str) -> AsyncIterator[None]:
    """A real PostgreSQL error, once: the first row written to ``table`` (insert or update) for which
    ``when`` (SQL over ``NEW``) holds fails its statement, as a passing database error would; every
    later one goes through. A trigger of the test's own, dropped on the way out."""
    name = f"canopy_test_fail_{uuid.uuid4().hex[:12]}"
    async with db.tx() as conn:
        await conn.execute(f"CREATE SEQUENCE {name}")
        await conn.execute(f"""CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF {when} THEN
                    IF nextval('{name}') = 1 THEN
                        RAISE EXCEPTION 'a database error made by the test ({name})';
                    END IF;
                END IF;
                RETURN NEW;
            END $$""")
        await conn.execute(f"CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON {table} "
                           f"FOR EACH ROW EXECUTE FUNCTION {name}()")
    try:
        yield
    finally:
        async with db.tx() as conn:
            await conn.execute(f"DROP TRIGGER {name} ON {table}")
            await conn.execute(f"DROP FUNCTION {name}()")
            await conn.execute(f"DROP SEQUENCE {name}")


async def a_root_in_host(runtime: Runtime, scope: Scope, index: int, text: str) -> dict[str, Any]:
    """A root session that host ``index`` runs, created with ``text`` as its input (roots made on the
    way run theirs in the other host)."""
    assert isinstance(runtime.placement, Hosted)
    while True:
        created = await runtime.create_root(scope, input_text=text)
        if runtime.placement.host_index(created["session"]["session_id"]) == index:
            return created


# A command that writes running.txt at once, beats once a second for a minute, then writes late.txt:
# still beating is still running.
BEATING = ("echo running > running.txt; i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo $i > beat.txt; sleep 1; done; "
           "echo late > late.txt")


async def assert_stopped(workdir: Path) -> None:
    """The BEATING command in ``workdir`` no longer runs. Called once what stops it has answered (a
    Turn's result that comes only after the stop): however long the stop took on a busy machine, a
    command left running still beats, where a fixed sleep in the command raced the stop."""
    before = await asyncio.to_thread((workdir / "beat.txt").read_text)
    await asyncio.sleep(2.5)
    assert await asyncio.to_thread((workdir / "beat.txt").read_text) == before
    assert not (workdir / "late.txt").exists()


@contextlib.asynccontextmanager
async def freed_only_by_the_loop() -> AsyncIterator[tuple[Callable[[], None], list[bool]]]:
    """``hold``, for a slow blocking call (a GCS lookup) to make first, and what each hold came to: a
    hold waits until this event loop frees it. Made on the loop, a call blocks the loop, so its hold
    runs out (10 s) and comes to False; made in a thread, the loop frees it: True."""
    loop = asyncio.get_running_loop()
    entered, freed = asyncio.Event(), threading.Event()
    held: list[bool] = []

    def hold() -> None:
        loop.call_soon_threadsafe(entered.set)
        held.append(freed.wait(10))

    async def free_once_entered() -> None:
        await entered.wait()
        freed.set()

    freeing = asyncio.create_task(free_once_entered())
    try:
        yield hold, held
    finally:
        freed.set()
        freeing.cancel()
