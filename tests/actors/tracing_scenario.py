"""One Turn with a tool call, traced to files, in a Ray cluster of its own (run by test_tracing.py).

``CANOPY_OTEL_EXPORTER`` is read by every Ray process when it first traces, so tracing cannot be
switched on inside the test session's cluster: this script starts a runtime with the setting on
(on a database of its own), runs a scripted root whose one Turn calls a tool, and prints one JSON
line of findings (the ids the spans must carry) for the test to check against the span files.

    CANOPY_OTEL_EXPORTER=file:/tmp/spans CANOPY_DATABASE_URL=... python -m tests.actors.tracing_scenario
"""

from __future__ import annotations

import asyncio
import json
import uuid

from actors.runtime import Runtime
from actors.scripted import call, say, script
from persistence.records import Scope
from tests.actors.helpers import rows

TEXT = script(call(("list_sessions", {})), say("listed"), task="trace this")


async def main() -> None:
    runtime = await Runtime.start(num_cpus=2)
    try:
        scope = Scope(f"user-{uuid.uuid4().hex[:8]}", "tracing")
        created = await runtime.create_root(scope, input_text=TEXT)
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
        turn = (await rows(runtime.db, "SELECT turn_id, session_id FROM turns WHERE turn_id = %s",
                           result["turn_id"]))[0]
        run_ids = [r["run_id"] for r in await rows(runtime.db, "SELECT run_id FROM runs WHERE turn_id = %s",
                                                   result["turn_id"])]
        # The Turn's span is written just after its end commits: give the actor a moment.
        await asyncio.sleep(2)
        print("FINDINGS " + json.dumps({"status": result["status"], "turn_id": str(turn["turn_id"]),
                                        "session_id": str(turn["session_id"]), "run_ids": [str(r) for r in run_ids],
                                        "tree_id": str(created["session"]["session_id"])}), flush=True)
    finally:
        await runtime.close(shutdown_ray=True)


if __name__ == "__main__":
    asyncio.run(main())
