"""Canopy on a Ray cluster of two nodes (``ray.cluster_utils.Cluster``, both on this machine) with one
database: a session started on each node calls its own node's model gateway, and the gateway of the
driver's node (the head) is killed during its session's call, which is asked again of a fresh one.
Run by test_gateways.py (one Ray per process, so not in the test session's); prints one JSON line.

    CANOPY_DATA_DIR=... SCENARIO_DATABASE_URL=... python -m tests.actors.gateways_scenario
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.util.state import list_actors

from actors.gateways import gateway_on, scripted_log_path
from actors.runtime import Runtime
from actors.scripted import say, script
from persistence.databases import rows
from persistence.db import Database, resolve_database_url
from persistence.records import Scope
from persistence.settings import Settings, get_settings


@ray.remote(num_cpus=0)
def create_root_here(user_id: str, app_id: str, text: str) -> dict[str, str]:
    """A root session created (and activated) from a worker of the node this task is pinned to."""

    async def create() -> dict[str, str]:
        settings = get_settings()
        url = resolve_database_url(settings)
        runtime = Runtime(await Database.connect(url, max_size=2), settings, url)
        try:
            created = await runtime.create_root(Scope(user_id, app_id), input_text=text)
        finally:
            await runtime.close()
        return {"session_id": str(created["session"]["session_id"]), "input_id": str(created["input"]["input_id"])}

    return asyncio.run(create())


def requests_with(settings: Settings, marker: str) -> int:
    log = Path(scripted_log_path(settings))
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if marker in json.dumps(json.loads(line)["messages"]))


def actors(prefix: str) -> list[Any]:
    """Every actor of this cluster (alive or not) whose name starts with ``prefix``, from Ray's actor table."""
    found = list_actors(address=ray.get_runtime_context().gcs_address, limit=10_000, detail=False)
    return [actor for actor in found if (actor.name or "").startswith(prefix)]


async def until(check: Any, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.1)


async def main() -> None:
    os.environ.pop("CANOPY_SECRETS_DIR", None)
    os.environ["CANOPY_SESSION_HOSTS"] = "0"  # a session's own actor: where its Runs execute is in the actor table
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    findings: dict[str, Any] = {}
    try:
        settings = Settings(ray_address=cluster.address, database_url=SecretStr(os.environ["SCENARIO_DATABASE_URL"]))
        runtime = await Runtime.start(settings)
        head = ray.get_runtime_context().get_node_id()
        other = next(node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != head)
        findings.update(head=head, other=other)
        scope = Scope(f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}")
        marker = f"head done {uuid.uuid4().hex[:8]}"  # in its request's messages too (the script says it)
        other_started = create_root_here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False))\
            .remote(scope.user_id, scope.app_id, script(say("other done")))
        on_head = await runtime.create_root(scope, input_text=script(say(marker, delay_ms=3000)))
        on_other = await other_started
        inputs = {"on_head": on_head["input"]["input_id"], "on_other": uuid.UUID(on_other["input_id"])}
        sessions = {"on_head": on_head["session"]["session_id"], "on_other": uuid.UUID(on_other["session_id"])}
        await until(lambda: requests_with(settings, marker) == 1, timeout=60)
        killed = gateway_on(head)
        ray.kill(killed)  # the head session's call is in flight in it

        results = {name: await runtime.wait_result(scope, input_id, timeout=90) for name, input_id in inputs.items()}
        findings["results"] = {name: [r["status"], r["output"]] for name, r in results.items()}
        findings["head_marker"] = marker
        findings["head_requests"] = requests_with(settings, marker)
        findings["killed_gateway_replaced"] = gateway_on(head)._actor_id != killed._actor_id
        findings["session_nodes"] = {}
        for name, session_id in sessions.items():
            nodes = {actor.node_id for actor in actors(f"session:{session_id}")}
            findings["session_nodes"][name] = nodes.pop() if len(nodes) == 1 else sorted(nodes)
        findings["gateways"] = {actor.node_id: actor.name for actor in actors("canopy:gateway:")
                                if actor.state == "ALIVE"}
        findings["call_nodes"], findings["charged"] = {}, {}
        for name, session_id in sessions.items():
            runs = await rows(runtime.db, "SELECT run_id, model_calls FROM runs WHERE session_id = %s", session_id)
            findings["charged"][name] = sum(run["model_calls"] for run in runs)
            await until_recorded(runtime.db, [run["run_id"] for run in runs])
            calls = await rows(runtime.db, "SELECT node_id FROM model_calls WHERE run_id = ANY(%s) ORDER BY id",
                               [run["run_id"] for run in runs])
            findings["call_nodes"][name] = [call["node_id"] for call in calls]
        await runtime.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
        print("FINDINGS " + json.dumps(findings), flush=True)  # what was found, even before a failure


async def until_recorded(db: Database, run_ids: list[uuid.UUID]) -> None:
    """The gateways write their records shortly after each reply (actors/gateway_actor.py)."""
    for _ in range(100):
        if await rows(db, "SELECT 1 FROM model_calls WHERE run_id = ANY(%s)", run_ids):
            await asyncio.sleep(0.5)  # and any second record with it
            return
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main())
