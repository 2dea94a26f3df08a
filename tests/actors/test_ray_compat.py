"""The private Ray APIs behind actors/ray_compat.py still do what Canopy uses them for, on the
Ray this is installed with (the pin in pyproject.toml); the Serve rebinding is checked by
tests/hostile/test_api_exposure.py."""

from __future__ import annotations

import asyncio
import time

import psutil
import ray

from actors.ray_compat import RayletWorkers
from actors.runtime import Runtime


def _idle_workers(raylet: psutil.Process) -> set[int]:
    found = set()
    for proc in raylet.children():
        try:
            title = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if title.startswith("ray::IDLE") or "default_worker.py" in title:
            found.add(proc.pid)
    return found


async def test_the_raylet_prestarts_idle_workers_on_request(runtime: Runtime) -> None:
    node = next(n for n in ray.nodes() if n["Alive"])
    raylet = next(p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "raylet"
                  and f"--node_id={node['NodeID']}" in " ".join(p.info["cmdline"] or []))
    before = _idle_workers(raylet)
    await RayletWorkers(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}").prestart(
        2, keep_alive_seconds=60, runtime_env=None, timeout=10)
    deadline = time.monotonic() + 60
    while len(_idle_workers(raylet) - before) < 2:
        assert time.monotonic() < deadline, "the raylet started no idle worker"
        await asyncio.sleep(0.2)
