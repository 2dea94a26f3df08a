"""Session hosts follow a node that joins (actors/placement.py ``follow_nodes``), on a Ray cluster
that starts with one node (``ray.cluster_utils.Cluster``, on this machine); hosted shape, two
hosts, ``spread``. Run by test_cluster_placement.py (one Ray per process); prints one JSON line.

Both hosts start on the only node. Each host's session gets a long Turn of many model steps and,
queued behind it at once, a short one, so that neither host is idle until both end; a second node
joins while the long Turns run, and the host that moves does so in the middle of its long Turn.
The findings: the Turns' results, which host left, each session's next Turn and the hosts' nodes
after it, and every Run of both sessions (its incarnation among them) read back from the database.

    SCENARIO_DATABASE_URL=... python -m tests.actors.node_join_scenario
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
import uuid
from typing import Any

import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster

from actors.runtime import Runtime
from actors.scripted import call, say, script
from persistence.databases import rows
from persistence.records import Scope
from persistence.settings import Settings
from tests.actors.cluster_placement_scenario import sweeper_on_the_head
from tests.actors.gateways_scenario import actors

HOSTS = 2
# The node has joined ~6 s into the Turn at most: the ~14 s left hold several of the sweeper's looks
# at the nodes (every 2 s in the tests), the first of which finds the host busy and has it drain.
# Each step reads the sessions, so that the long Run is ten model steps of 2 s.
LONG_STEPS, STEP_MS = 10, 2_000
LONG_TURN = script(*(call(("list_sessions", {}), delay_ms=STEP_MS) for _ in range(LONG_STEPS - 1)),
                   say("long", delay_ms=STEP_MS))


def host_nodes() -> dict[str, dict[str, str]]:
    """Each live host's node and actor id, from Ray's actor table."""
    return {actor.name: {"node": actor.node_id, "actor": actor.actor_id}
            for actor in actors("canopy:sessions:") if actor.state == "ALIVE"}


async def one_root_per_host(runtime: Runtime, scope: Scope) -> dict[int, dict[str, Any]]:
    """Root sessions until one runs in each host (a session's host is its id mod the hosts), each
    with a first, short Turn done."""
    roots: dict[int, dict[str, Any]] = {}
    while len(roots) < HOSTS:
        created = await runtime.create_root(scope, input_text=script(say("first")))
        await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
        roots.setdefault(runtime.placement.host_index(created["session"]["session_id"]), created["session"])
    return roots


async def turns(runtime: Runtime, scope: Scope, roots: dict[int, dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """One Turn of ``text`` in each root, at once; their results."""
    receipts = [await runtime.submit_input(scope, root["session_id"], text) for root in roots.values()]
    return [{"status": r["status"], "output": r["output"]} for r in await asyncio.gather(
        *(runtime.wait_result(scope, receipt["input_id"], timeout=120) for receipt in receipts))]


async def until_a_host_left(before: dict[str, dict[str, str]], timeout: float) -> dict[str, Any]:
    """The hosts of ``before`` no longer alive as they were, once one is; seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        now = host_nodes()
        left = sorted(name for name, host in before.items() if now.get(name, {}).get("actor") != host["actor"])
        if left:
            return {"left": left, "seconds": round(time.monotonic() - started, 1)}
        await asyncio.sleep(0.3)
    return {"left": [], "seconds": timeout}


async def main() -> None:
    for name in ("CANOPY_RAY_ADDRESS", "CANOPY_SECRETS_DIR", "CANOPY_DATABASE_URL"):
        os.environ.pop(name, None)
    os.environ.update({"CANOPY_SESSION_HOSTS": str(HOSTS), "CANOPY_SESSION_SPREAD": "spread"})
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                            "dashboard_host": "127.0.0.1", "dashboard_port": None})
    findings: dict[str, Any] = {"head": cluster.head_node.node_id}
    try:
        database_url = os.environ["SCENARIO_DATABASE_URL"]
        settings = Settings(ray_address=cluster.address, database_url=SecretStr(database_url))
        sweeper_on_the_head(settings, database_url, cluster.head_node.node_id)
        runtime = await Runtime.start(settings)
        scope = Scope(f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}")
        roots = await one_root_per_host(runtime, scope)
        findings["hosts_at_start"] = host_nodes()

        # A host of one session busy without a pause: the short Turn begins as the long one ends.
        long = [await runtime.submit_input(scope, root["session_id"], LONG_TURN)
                for root in roots.values()]
        short = [await runtime.submit_input(scope, root["session_id"], script(say("next"))) for root in roots.values()]
        await asyncio.sleep(1)
        findings["joined"] = cluster.add_node(num_cpus=1).node_id  # Ray's signal handlers: the main thread only
        cluster.wait_for_nodes()
        for name, receipts in (("long", long), ("next", short)):
            findings[name] = [{"status": r["status"], "output": r["output"]} for r in await asyncio.gather(
                *(runtime.wait_result(scope, receipt["input_id"], timeout=120) for receipt in receipts))]

        findings["move"] = await until_a_host_left(findings["hosts_at_start"], timeout=60)
        findings["after"] = await turns(runtime, scope, roots, script(say("after")))
        findings["hosts_after_move"] = host_nodes()
        findings["runs"] = {str(index): [f"{r['kind']}:{r['status']}:{r['error']}|{r['owner']}" for r in await rows(
            runtime.db, "SELECT kind, status, error, owner FROM runs WHERE session_id = %s ORDER BY queued_at",
            root["session_id"])] for index, root in roots.items()}
        await runtime.close()
    except BaseException:
        findings["error"] = traceback.format_exc(limit=6)
        raise
    finally:
        print("FINDINGS " + json.dumps(findings, default=str), flush=True)  # even before a failure
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
