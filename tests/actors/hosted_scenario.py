"""Shared session hosts end to end, in a Ray cluster of its own (run by test_session_hosts.py).

``CANOPY_SESSION_HOSTS`` is read by every Ray process when it starts, so the hosted shape
cannot be switched on inside the test session's cluster: this script starts a second
runtime with the setting on (same database), runs a fan-out (whose tree supervisor lives in a host too),
lets the hosts go idle and brings the tree back, and a kill -9 of the host that runs a
member mid-Turn, and prints one JSON line of findings for the test to check.

    CANOPY_SESSION_HOSTS=2 CANOPY_DATABASE_URL=... python -m tests.actors.hosted_scenario
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from typing import Any

import ray
from ray.util.state import list_actors, list_tasks

from actors import local_channel
from actors.naming import NAMESPACE, host_actor_name, host_index, session_hosts_setting
from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.records import Scope
from persistence.settings import Settings
from tests.actors.helpers import eventually, peak_concurrent_runs, rows, session_id_at


async def fan_out(runtime: Runtime, scope: Scope) -> dict[str, Any]:
    children = 6
    text = script(
        call(*(create(f"h{i}", script(say(f"h{i} done", delay_ms=200))) for i in range(children))),
        call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(children)]})),
        say("fan-out done"),
    )
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    tasks_seen: set[str] = set()
    address = ray.get_runtime_context().gcs_address

    async def watch() -> None:
        while True:
            found = await asyncio.to_thread(list_tasks, address=address, filters=[("state", "=", "RUNNING")],
                                            limit=10_000)
            tasks_seen.update(t.name for t in found if t.name.startswith("session:"))
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    try:
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
    finally:
        watcher.cancel()
    alive = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000)
    members = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s", tree_id)
    return {"status": result["status"], "output": result["output"], "tree_id": str(tree_id),
            "session_actors": sorted(a.name for a in alive if (a.name or "").startswith("session:")),
            "hosts": sorted(a.name for a in alive if (a.name or "").startswith("canopy:sessions:")),
            "tree_actors": sorted(a.name for a in alive if (a.name or "").startswith("tree:")),
            "peak_runs": await peak_concurrent_runs(runtime.db, tree_id),
            "session_tasks_seen": len(tasks_seen & {f"session:{m['session_id']}" for m in members}),
            "members": len(members),
            # This process activated the root: through the root's host's socket, not a Ray call.
            "hint_channels": sorted(name for name, channel
                                    in local_channel._channels[asyncio.get_running_loop()].items()
                                    if type(channel).__name__ == "_Channel")}


async def idle_and_back(runtime: Runtime, scope: Scope, tree_id: str) -> dict[str, Any]:
    """After ``actor_idle_seconds`` the hosts hold no session and no tree supervisor; a new
    input to the tree brings both back and is answered."""
    hosts = [ray.get_actor(host_actor_name(i), namespace=NAMESPACE) for i in range(session_hosts_setting())]

    async def emptied() -> list[dict[str, Any]] | None:
        found = [await host.status.remote() for host in hosts]
        return found if all(f["sessions"] == 0 and f["trees"] == 0 for f in found) else None

    idle = await eventually(emptied, timeout=60, every=0.5)
    receipt = await runtime.submit_input(scope, uuid.UUID(tree_id), script(say("back again")))
    result = await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    return {"emptied": idle is not None, "status": result["status"], "output": result["output"]}


async def kill_host_mid_turn(runtime: Runtime, scope: Scope) -> dict[str, Any]:
    # The member creates a grandchild and messages its parent: both side effects must happen once.
    member = script(call(create("g", script(say("g done"))), ("send_message", {"target": "/root", "text": "once"})),
                    call(("wait_inputs", {"input_ids": ["$${0.input_id}"]})), say("member done $${2.results.0.output}"))
    text = script(call(create("fp-member", member)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("root got ${1.results.0.output}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]

    async def member_id() -> uuid.UUID | None:
        found = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = "
                           "'/root/fp-member'", tree_id)
        return found[0]["session_id"] if found else None

    member_id_ = await eventually(member_id)
    # after_model_commit: the reply with the tool calls is committed, no tool has run yet.
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM thread_messages WHERE session_id = %s "
                                  "AND role = 'assistant'", member_id_))
    await asyncio.sleep(0.5)  # inside the failpoint's pause
    host = ray.get_actor(host_actor_name(host_index(member_id_, session_hosts_setting())), namespace=NAMESPACE)
    status = await host.status.remote(str(member_id_))
    os.kill(int(status["pid"]), signal.SIGKILL)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
    await runtime.wait_tree_idle(scope, tree_id, timeout=60)
    grandchildren = await rows(runtime.db, "SELECT count(*) AS n FROM sessions WHERE parent_id = %s", member_id_)
    sent = await rows(runtime.db, "SELECT count(*) AS n FROM coop_messages WHERE sender_session_id = %s", member_id_)
    recovered = await rows(runtime.db, "SELECT count(*) AS n FROM runs WHERE session_id = %s AND status = "
                           "'interrupted' AND error LIKE 'lease expired%%'", member_id_)
    g = await session_id_at(runtime.db, tree_id, "/root/fp-member/g")
    return {"status": result["status"], "output": result["output"], "owned_by_killed_pid": status["owner"] is not None,
            "grandchildren": grandchildren[0]["n"], "messages": sent[0]["n"], "recovered": recovered[0]["n"],
            "grandchild_found": g is not None}


async def main() -> None:
    runtime = await Runtime.start(Settings(), num_cpus=2, include_dashboard=True)
    try:
        fan_scope = Scope(f"hosted-{uuid.uuid4().hex[:6]}", "app")
        fan = await fan_out(runtime, fan_scope)
        findings = {"fan_out": fan, "idle": await idle_and_back(runtime, fan_scope, fan["tree_id"]),
                    "kill": await kill_host_mid_turn(runtime, Scope(f"hosted-{uuid.uuid4().hex[:6]}", "app"))}
    finally:
        await runtime.close(shutdown_ray=True)
    print("FINDINGS " + json.dumps(findings, default=str), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
