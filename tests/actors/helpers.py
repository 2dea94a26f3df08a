"""Helpers for the actor tests: reads of durable facts, polling, scenario runs, and a test actor that
calls the gateway as a session does (scripts are written with the public builders of
``actors.scripted``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import ray

from actors.scripted import script
from persistence.databases import rows
from persistence.db import Database


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


# The name a channel caller keeps its connection to the gateway under.
GATEWAY = "test-gateway"


def model_request(run_id: str, *steps: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``complete_for_run`` for a scripted reply."""
    return {"run_id": run_id, "model": "canopy/scripted", "tools": None, "watch": None,
            "messages": [{"role": "user", "content": script(*steps)}]}


def channel_caller() -> Any:
    """An async actor that makes model calls like a session does, through ``local_channel`` to the
    gateway it is given (defined in a function so that Ray ships the class by value)."""

    @ray.remote(num_cpus=0)
    class Caller:
        def __init__(self, gateway: Any) -> None:
            self.gateway = gateway
            self.running: asyncio.Task[Any] | None = None

        async def call(self, **request: Any) -> dict[str, Any]:
            from actors import local_channel

            return await local_channel.call(self.gateway, GATEWAY, "complete_for_run", **request)

        async def start(self, **request: Any) -> None:
            self.running = asyncio.create_task(self.call(**request))

        async def cancel(self) -> None:
            assert self.running is not None
            self.running.cancel()

        async def outcome(self) -> str:
            assert self.running is not None
            try:
                return json.dumps(await self.running)
            except BaseException as error:  # the outcome, cancellation included, is what the test reads
                return f"{type(error).__name__}: {error}"

        async def transport(self) -> str:
            from actors import local_channel

            return type(local_channel._channels[asyncio.get_running_loop()].get(GATEWAY)).__name__

    return Caller


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
