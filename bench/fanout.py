"""Fan-out benchmark: a root creates N children, each does K model steps of L ms.

Prints the makespan, the ideal ceil(N/slots)·K·L (plus the root's own steps), their
ratio, the runtime overhead per model step at L = 0, the peak of live session actors,
and the peak RSS of all Canopy/Ray processes.

    python bench/fanout.py --children 12 --steps 3 --latency-ms 200
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import psutil

from actors.runtime import Runtime
from persistence.records import Scope
from persistence.settings import Settings
from tests.actors.helpers import call, create, say, script

ROOT_STEPS = 3  # create all, wait, summarise


def child_script(steps: int, latency_ms: int) -> str:
    work = [call(("list_agents", {}), delay_ms=latency_ms) for _ in range(steps - 1)]
    return script(*work, say("done", delay_ms=latency_ms))


def root_script(children: int, steps: int, latency_ms: int) -> str:
    return script(
        call(*(create(f"c{i}", child_script(steps, latency_ms)) for i in range(children))),
        call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(children)]})),
        say("summary"),
    )


class Sampler:
    """Samples live session actors and total RSS of Ray's processes every 0.2 s."""

    def __init__(self) -> None:
        self.peak_rss = 0
        self.peak_sessions = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = sessions = 0
            for proc in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                if "ray" in cmd or "postgres" in cmd or proc.pid == os.getpid():
                    rss += proc.info["memory_info"].rss if proc.info["memory_info"] else 0
                if "SessionActorImpl" in cmd:
                    sessions += 1
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_sessions = max(self.peak_sessions, sessions)
            time.sleep(0.2)


async def one(runtime: Runtime, children: int, steps: int, latency_ms: int) -> tuple[float, Sampler]:
    scope = Scope(f"bench-{uuid.uuid4().hex[:6]}", "bench")
    with Sampler() as sampler:
        started = time.monotonic()
        created = await runtime.create_root(scope, input_text=root_script(children, steps, latency_ms))
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=900, poll_seconds=0.02)
        elapsed = time.monotonic() - started
    assert result["status"] == "completed", result
    return elapsed, sampler


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        os.environ["CANOPY_DATA_DIR"] = data_dir
        settings = Settings(data_dir=Path(data_dir))
        runtime = await Runtime.start(settings)
        slots = settings.tree_slots
        await one(runtime, 2, 1, 0)  # warm up: actors, litellm, connections
        makespan, sampler = await one(runtime, args.children, args.steps, args.latency_ms)
        ideal = (math.ceil(args.children / slots) * args.steps + ROOT_STEPS) * args.latency_ms / 1000
        zero, _ = await one(runtime, args.children, args.steps, 0)
        model_steps = args.children * args.steps + ROOT_STEPS
        print(f"children={args.children} steps={args.steps} latency={args.latency_ms}ms slots={slots}")
        print(f"makespan            {makespan:8.2f} s")
        print(f"ideal               {ideal:8.2f} s   (ceil(N/{slots})*K*L + root steps)")
        print(f"ratio               {makespan / ideal:8.2f} x ideal")
        print(f"overhead at L=0     {zero / model_steps * 1000:8.1f} ms per model step "
              f"({zero:.2f} s for {model_steps} steps)")
        print(f"peak live sessions  {sampler.peak_sessions:8d}")
        print(f"peak RSS (Ray+PG)   {sampler.peak_rss / 2**20:8.0f} MiB")
        await runtime.close(shutdown_ray=True)


if __name__ == "__main__":
    asyncio.run(main())
