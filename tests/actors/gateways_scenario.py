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

import psutil
import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from actors.gateways import gateway_on, scripted_log_path
from actors.hosting import SHAPE_ACTORS
from actors.naming import gateway_actor_name, node_local_options, session_actor_name
from actors.runtime import Runtime
from actors.scripted import say, script
from persistence.databases import rows
from persistence.db import Database
from persistence.records import Scope
from persistence.settings import Settings
from tests.ports import free_port

# A session pinned by ``session_on`` must not passivate before its input reaches it: the tests' 6 s
# idle was shorter than that on a busy CI machine, and the placement then made it again elsewhere.
PINNED_ENV = {"CANOPY_ACTOR_IDLE_SECONDS": "120"}


async def session_on(runtime: Runtime, scope: Scope, node_id: str, text: str) -> dict[str, Any]:
    """A root session whose actor runs on ``node_id``, then its first input. Ray places a zero-CPU actor
    on a node of its choosing, so the actor the placement's get-or-create finds is made first, pinned."""
    created = await runtime.create_root(scope)
    session_id = created["session"]["session_id"]
    actor = SHAPE_ACTORS.session.options(**node_local_options(session_actor_name(session_id), node_id)) \
        .remote(str(session_id))
    owner = (await actor.status.remote())["owner"]
    receipt = await runtime.submit_input(scope, session_id, text)
    return {"session_id": session_id, "input_id": receipt["input_id"], "owner": owner}


def requests_with(settings: Settings, marker: str) -> int:
    """Requests with ``marker`` the scripted models (every gateway's: one log) read, whole lines only
    (another request's line may be being appended)."""
    log = Path(scripted_log_path(settings))
    lines = log.read_text().split("\n")[:-1] if log.exists() else []
    return sum(1 for line in lines if marker in line)


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
    # The dashboard serves Ray's state API (the actor table); other Rays on this machine hold the default port.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                            "dashboard_port": free_port()})
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
        started = {"on_head": await session_on(runtime, scope, head, script(say(marker, delay_ms=3000))),
                   "on_other": await session_on(runtime, scope, other, script(say("other done")))}
        await until(lambda: requests_with(settings, marker) == 1, timeout=60)
        killed = gateway_on(head)
        ray.kill(killed)  # the head session's call is in flight in it

        results = {name: await runtime.wait_result(scope, one["input_id"], timeout=90) for name, one in started.items()}
        findings["results"] = {name: [r["status"], r["output"]] for name, r in results.items()}
        findings["head_marker"] = marker
        findings["head_requests"] = requests_with(settings, marker)
        alive = [actor.actor_id for actor in actors(gateway_actor_name(head)) if actor.state == "ALIVE"]
        findings["killed_gateway_replaced"] = len(alive) == 1 and alive[0] != killed._actor_id.hex()
        findings["session_nodes"], findings["run_owners"] = {}, {}
        for name, one in started.items():
            nodes = {actor.node_id for actor in actors(session_actor_name(one["session_id"]))}
            findings["session_nodes"][name] = nodes.pop() if len(nodes) == 1 else sorted(nodes)
            owners = await rows(runtime.db, "SELECT owner FROM runs WHERE session_id = %s", one["session_id"])
            findings["run_owners"][name] = [run["owner"] == one["owner"] for run in owners]
        findings["gateways"] = {actor.node_id: actor.name for actor in actors("canopy:gateway:")
                                if actor.state == "ALIVE"}
        # A runtime that joins a cluster hands its workers their environment in the job's runtime_env
        # (psutil reads /proc/<pid>/environ: the environment the process started with, which glibc read).
        findings["gateway_malloc_arenas"] = {
            actor.node_id: psutil.Process(actor.pid).environ().get("MALLOC_ARENA_MAX")
            for actor in actors("canopy:gateway:") if actor.state == "ALIVE"}
        findings["call_nodes"], findings["charged"] = {}, {}
        for name, one in started.items():
            runs = await rows(runtime.db, "SELECT run_id, model_calls FROM runs WHERE session_id = %s",
                              one["session_id"])
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
