"""A session host's memory by the sessions it has served: does a long-lived host give back what
its sessions used?

    python bench/host_memory.py [--rounds 70] [--children 100] [--latency-ms 10] [--every 5]

Runs ``--rounds`` fan-outs of ``--children`` one-step children (bench/fanout.py's tree) one after
another against one runtime in the hosted shape (``CANOPY_SESSION_HOSTS``, default 2) and prints,
every ``--every`` rounds, the sessions served so far and each host's RSS, then the hosts' growth
per 1,000 sessions served over the second half of the rounds (the first rounds fill pools, caches
and prepared statements).

The runtime's processes run with ``MALLOC_ARENA_MAX=2`` (actors/runtime.py) unless the environment
says otherwise: ``MALLOC_ARENA_MAX=16 python bench/host_memory.py`` runs with glibc's default on two
cores (8 arenas per core).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

import psutil
import ray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.naming import NAMESPACE, host_actor_name
from actors.runtime import Runtime
from bench.fanout import one
from persistence.databases import rows
from persistence.settings import Settings

MIB = 2**20


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares growth of RSS (MiB) per session served."""
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=70)
    parser.add_argument("--children", type=int, default=100)
    parser.add_argument("--latency-ms", type=int, default=10)
    parser.add_argument("--every", type=int, default=5, help="print the hosts' RSS every this many rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        os.environ["CANOPY_DATA_DIR"] = data_dir
        settings = Settings(data_dir=Path(data_dir))
        if settings.session_hosts < 1:
            raise SystemExit("host_memory measures session hosts: run it with CANOPY_SESSION_HOSTS >= 1")
        runtime = await Runtime.start(settings)
        hosts = [ray.get_actor(host_actor_name(k), namespace=NAMESPACE) for k in range(settings.session_hosts)]
        pids = [await host.ready.remote() for host in hosts]
        arenas = psutil.Process(pids[0]).environ().get("MALLOC_ARENA_MAX")  # as the host started
        print(f"hosts {len(hosts)}  MALLOC_ARENA_MAX in the hosts: {arenas}  "
              f"children {args.children} x 1 step of {args.latency_ms} ms per round")
        points: list[tuple[int, float]] = []
        for done in range(1, args.rounds + 1):
            await one(runtime, Path(data_dir), args.children, 1, args.latency_ms)
            if done % args.every and done != args.rounds:
                continue
            served = (await rows(runtime.db, "SELECT count(*) AS n FROM sessions"))[0]["n"]
            rss = [psutil.Process(pid).memory_info().rss / MIB for pid in pids]
            print(f"round {done:4d}  sessions served {served:6d}  host RSS "
                  + ", ".join(f"{value:.0f}" for value in rss) + " MiB", flush=True)
            if done > args.rounds // 2:
                points.append((served, statistics.fmean(rss)))
        growth = f"{slope(points) * 1000:.1f} MiB" if len(points) > 1 else "n/a (fewer than two readings)"
        print(f"growth              {growth} per 1,000 sessions served (second half, mean of the hosts)")
        await runtime.close(shutdown_ray=True)


if __name__ == "__main__":
    asyncio.run(main())
