"""The live-session cap (SPEC §10): past ``max_live_sessions`` the least recently used idle
sessions passivate first, so a fan-out never means one live session (nor process) per child.
Also: the sweeper's per-tree sandbox idle release, isolated from the sweep's other steps.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray

from actors import directory as directory_client
from actors.directory import SessionDirectory, SessionDirectoryImpl, directory_handle
from actors.naming import NAMESPACE, NodeLocal, node_local_options
from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from actors.sweeper import SweeperImpl
from persistence.records import Scope
from tests.actors.helpers import eventually, freed_only_by_the_loop, live_sessions, rows


async def test_fan_out_stays_under_the_live_cap(runtime: Runtime, scope: Scope) -> None:
    cap, children = 2, 14
    directory = directory_handle()
    previous = await directory.configure.remote(max_live_sessions=cap)
    evictions_before = (await directory.stats.remote())["evictions"]
    samples: list[int] = []

    async def sample() -> None:
        while True:
            try:
                samples.append(await live_sessions(runtime))
            except Exception as error:  # keep sampling; an empty sample list fails the test below
                print(f"sampling live actors failed: {error}")
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    try:
        text = script(
            call(*(create(f"q{i}", script(say(f"q{i} done", delay_ms=300))) for i in range(children))),
            call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(children)]})),
            say("all done"),
        )
        created = await runtime.create_root(scope, input_text=text)
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=180)
    finally:
        sampler.cancel()
        await directory.configure.remote(**previous)
    print(f"live sessions sampled every 0.2 s: {samples}")
    assert (result["status"], result["output"]) == ("completed", "all done")
    tree_id = created["session"]["session_id"]
    done = await rows(runtime.db, "SELECT t.status FROM turns t JOIN sessions s USING (session_id) "
                      "WHERE s.tree_id = %s AND s.parent_id IS NOT NULL", tree_id)
    assert [r["status"] for r in done] == ["completed"] * children
    # In flight beyond the cap: busy sessions, which are never interrupted, and ones still
    # starting (together at most one per slot), plus evicted ones still exiting (at most one
    # per slot too). Without the cap all 15 would stay alive for actor_idle_seconds.
    assert samples and max(samples) <= cap + 2 * runtime.settings.tree_slots, samples
    assert (await directory.stats.remote())["evictions"] > evictions_before


class _FakeSession:
    """A stand-in for a session actor handle: records whether it was asked to passivate."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.passivate_if_idle = self
        self._log = log

    async def remote(self, owner: str) -> bool:
        self._log.append(self.name)
        return True


async def test_directory_passivates_least_recently_used_idle_first() -> None:
    directory = SessionDirectoryImpl("node-under-test")
    evicted: list[str] = []
    try:
        await directory.configure(max_live_sessions=10)
        for name in ("a", "b", "c", "d", "e"):
            await directory.report(name, f"{name}-1", _FakeSession(name, evicted), busy=False)
        await directory.report("a", "a-1", _FakeSession("a", evicted), busy=True)  # a: busy, most recent
        await directory.report("c", "c-1", _FakeSession("c", evicted), busy=False)  # c: used again
        await directory.configure(max_live_sessions=2)
        for _ in range(20):
            await asyncio.sleep(0)
        # Order of use: b, d, e, a (busy), c -> the three least recently used idle ones go.
        assert evicted == ["b", "d", "e"]
        stats = await directory.stats()
        assert (stats["live"], stats["busy"], stats["evictions"]) == (2, 1, 3)
    finally:
        if directory._prune_task is not None:
            directory._prune_task.cancel()


async def test_reports_keep_the_latest_per_session_and_precede_a_departure(runtime: Runtime) -> None:
    """A process's reports are sent together, a little later: a session's later report replaces
    its earlier one, and a departure is sent after the reports made before it."""
    handle = directory_handle()
    previous = await handle.configure.remote(max_live_sessions=10_000)  # no eviction meanwhile
    ids = [f"outbox-{uuid.uuid4().hex[:8]}" for _ in range(3)]

    async def known_as(expected: list[dict[str, Any] | None]) -> bool:
        return [await handle.entry.remote(session_id) for session_id in ids] == expected

    def entry(session_id: str, busy: bool) -> dict[str, Any]:
        return {"owner": f"{session_id}-1", "busy": busy}

    try:
        # Fire and forget, as sessions report: the waits below cover the directory's first start on a
        # loaded machine (up to seconds), not the 50 ms of batching.
        for session_id in ids:
            directory_client.report(session_id, f"{session_id}-1", None, busy=True)
        directory_client.report(ids[0], f"{ids[0]}-1", None, busy=False)  # idle again: replaces busy
        assert await eventually(lambda: known_as([entry(ids[0], False), entry(ids[1], True), entry(ids[2], True)]),
                                timeout=30)
        directory_client.report(ids[1], f"{ids[1]}-1", None, busy=False)
        directory_client.gone(ids[1], f"{ids[1]}-1")  # sent at once, after the pending report
        assert await eventually(lambda: known_as([entry(ids[0], False), None, entry(ids[2], True)]), timeout=30)
    finally:
        for session_id in ids:
            directory_client.gone(session_id, f"{session_id}-1")
        await handle.configure.remote(**previous)


async def test_a_report_that_arrives_after_its_departure_is_dropped(runtime: Runtime) -> None:
    """Ray runs an async actor's calls in no guaranteed order: a report can reach the directory
    after the departure sent behind it. It is dropped (an incarnation never comes back); a new
    incarnation of the same session is known again."""
    handle = directory_handle()
    session_id = f"late-{uuid.uuid4().hex[:8]}"
    try:
        await handle.gone.remote(session_id, f"{session_id}-1")
        await handle.report.remote(session_id, f"{session_id}-1", None, False)
        overtaken = await handle.entry.remote(session_id)
        await handle.report.remote(session_id, f"{session_id}-2", None, True)
        assert overtaken is None
        assert await handle.entry.remote(session_id) == {"owner": f"{session_id}-2", "busy": True}
    finally:
        await handle.gone.remote(session_id, f"{session_id}-2")


@pytest.mark.default_shape  # no session: the test process reports
async def test_a_report_whose_directory_must_be_looked_up_leaves_the_loop_running(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process looks its node's directory up on its first report and after the directory died,
    a call to Ray's GCS that takes seconds under load. Reports are sent from the loop's callbacks
    (a session host's loop: every session's lease renewals and model calls): the lookup must not
    hold it. What was reported meanwhile still arrives, in the order it was sent."""
    name = f"directory-{uuid.uuid4().hex[:8]}"
    session_id = f"looked-up-{uuid.uuid4().hex[:8]}"
    async with freed_only_by_the_loop() as (hold, held):

        def slow_make(node_id: str) -> Any:
            hold()
            return SessionDirectory.options(**node_local_options(name, node_id)).remote(node_id)

        local = NodeLocal(slow_make)
        monkeypatch.setattr(directory_client, "_local", local)
        monkeypatch.setattr(directory_client, "_tell", directory_client._Sender().tell)  # none queued before
        try:
            directory_client.report(session_id, f"{session_id}-1", None, busy=True)
            directory_client.gone(f"{session_id}-x", f"{session_id}-x1")  # sends the report above, then this
            directory_client.report(session_id, f"{session_id}-1", None, busy=False)  # a later batch
            handle = await eventually(lambda: asyncio.sleep(0, local.kept()), timeout=30)

            seen: list[Any] = []

            async def known() -> bool:  # the batches came in the order they were sent: idle, as last reported
                seen.append(await handle.entry.remote(session_id))
                return seen[-1] == {"owner": f"{session_id}-1", "busy": False}

            try:  # a new directory is a new worker process: seconds on a loaded machine
                await eventually(known, timeout=60)
            except TimeoutError:
                raise AssertionError(f"the directory's entries last read: {seen[-3:]}") from None
        finally:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
    assert held == [True]


# A process whose Ray is gone (a driver after ray.shutdown, a test's runtime torn down) reports.
_REPORT_WITHOUT_RAY = """
import asyncio, time, ray
from actors import directory
async def main():
    directory.report("s", "s-1", None, busy=True)
    directory.gone("s", "s-1")
    await asyncio.sleep(0.5)
asyncio.run(main())
time.sleep(0.5)
print(ray.is_initialized())
"""


def test_a_report_made_where_ray_is_not_connected_starts_no_ray() -> None:
    """Asking Ray for the runtime context (this node, to find its directory) starts a Ray of its own
    in a process that is not connected: a report sent after a driver's ray.shutdown started a second
    cluster there (and a runtime started next was told ``ray.init`` twice). A report is a hint: not
    sent."""
    done = subprocess.run([sys.executable, "-c", _REPORT_WITHOUT_RAY], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.split() == ["False"], (done.stdout, done.stderr[-2000:])


class _FakeSandboxes:
    def __init__(self) -> None:
        self.calls = 0

    async def release_idle(self) -> list[uuid.UUID]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("docker is having a bad day")
        return [uuid.uuid4()]

    async def reap_orphans(self) -> list[str]:
        return ["orphan-handle"]


async def test_sweeper_releases_idle_sandboxes_in_isolation(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    sweeper = SweeperImpl()
    sandboxes = sweeper.sandboxes = _FakeSandboxes()

    async def broken(_db: Any) -> None:
        raise RuntimeError("this step fails")

    monkeypatch.setattr(sweeper, "_recover_expired", broken)
    await sweeper.sweep_once(runtime.db)  # the recovery step and the release fail: the round still completes
    await sweeper.beside["sandboxes"]  # the release runs beside the round, never holding up recovery
    await sweeper.sweep_once(runtime.db)  # hosts are asked for idle sandboxes once in a tenth of the idle time
    assert sandboxes.calls == 1
    await asyncio.sleep(runtime.settings.sandbox_idle_seconds / 10)  # the tests' 20 s: 2 s
    await sweeper.sweep_once(runtime.db)
    await sweeper.beside["sandboxes"]
    assert sandboxes.calls == 2
    assert (await sweeper.stats())["rounds"] == 3
    assert (await sweeper.stats())["sandboxes_released"] == 1
    assert (await sweeper.stats())["sandboxes_reaped"] == 1  # reaped once: at most every 60 s
