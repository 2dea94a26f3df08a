"""A session host that drains for longer than a lease lasts (the defaults: a 60 s drain, a 30 s
lease), in a runtime of its own (its settings are every Ray process's): a root is given work
while its host drains, and its Run, granted at once, waits for the drain to end. Run by
test_placement.py; prints one JSON line.

    CANOPY_DATABASE_URL=... CANOPY_LEASE_SECONDS=3 CANOPY_HEARTBEAT_SECONDS=0.5 CANOPY_HOST_DRAIN_SECONDS=10 \\
        python -m tests.actors.drain_scenario
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from actors.placement import Hosted
from actors.runtime import Runtime
from actors.scripted import say, script
from persistence.records import Scope
from persistence.runs import LEASE_EXPIRED
from tests.actors.helpers import a_root_in_host, eventually, rows


async def main() -> None:
    runtime = await Runtime.start(num_cpus=2)
    findings: dict[str, Any] = {}
    try:
        assert isinstance(runtime.placement, Hosted)
        scope = Scope(f"user-{uuid.uuid4().hex[:8]}", "drain")
        busy = await a_root_in_host(runtime, scope, 0, script(say("busy done", delay_ms=15_000)))
        host = runtime.placement.session_actor(busy["session"]["session_id"])

        async def running() -> Any:
            return ((await runtime.placement.session_status(busy["session"]["session_id"])) or {}).get("turn_id")

        await eventually(running, timeout=60)
        findings["moved"] = await host.move.remote("f" * 56)  # draining: its Run goes on
        waited = await a_root_in_host(runtime, scope, 0, script(say("waited")))
        results = [await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
                   for created in (waited, busy)]
        findings["results"] = [[r["status"], r["output"]] for r in results]
        findings["waited_runs"] = [[row["status"], row["error"] == LEASE_EXPIRED] for row in await rows(
            runtime.db, "SELECT status, error FROM runs WHERE session_id = %s ORDER BY queued_at",
            waited["session"]["session_id"])]
    finally:
        await runtime.close(shutdown_ray=True)
        print("FINDINGS " + json.dumps(findings), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
