"""A tree on a Ray cluster of three nodes (``ray.cluster_utils.Cluster``, all on this machine), in
the shape the environment asks for (``CANOPY_SESSION_HOSTS``). Run by test_cluster_placement.py
(one Ray per process, so not in the test session's); prints one JSON line of findings.

``SCENARIO_CASES`` names the cases to run, one after another on the same cluster and runtime
(``spread,node_lost``: the node goes last), or ``pack`` alone (``CANOPY_SESSION_SPREAD`` is
``pack`` then, ``spread`` otherwise); the findings hold each case's under its name.

- ``spread`` (or ``pack``): a root fans out to children whose Turns run at once; the findings name
  the nodes each member ran on: those of the gateways its model calls went through (each
  node's own, read from ``model_calls``) and those Ray's actor table showed its actor on.
- ``node_lost``: while the children's Turns run, a worker node that runs some of
  them (never the head, where the driver, its model gateway and the sweeper are) is removed; the findings
  are the tree's Turns, Runs and messages read back from the database once the root finished.

    SCENARIO_CASES=spread,node_lost SCENARIO_DATABASE_URL=... python -m tests.actors.cluster_placement_scenario
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import traceback
import uuid
from collections import defaultdict
from typing import Any

import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.util.state import list_actors

from actors.naming import SWEEPER_NAME, named_options
from actors.runtime import Runtime, init_ray
from actors.scripted import call, create, say, script
from actors.sweeper import Sweeper
from persistence.databases import rows
from persistence.records import Scope
from persistence.runs import LEASE_EXPIRED
from persistence.settings import Settings

CHILDREN = 6
# A child's tool step, then its final reply. The node goes while Turns run, and a child is found
# running there at the latest when its tool step's call is recorded: its final reply must outlast
# the node's removal then (lease expiry, 5 s, recovers its Run).
STEP_MS = {"spread": (1500, 1500), "pack": (1500, 1500), "node_lost": (3000, 6000)}


class ActorWatch:
    """The nodes Ray's actor table showed each live named actor on, polled while the tree runs."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.nodes: dict[str, set[str]] = defaultdict(set)
        self.errors: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> None:
        actors = await asyncio.to_thread(list_actors, address=self.address, filters=[("state", "=", "ALIVE")],
                                         limit=10_000)
        for actor in actors:
            if actor.name:
                self.nodes[actor.name].add(actor.node_id)

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as error:  # the state API may not answer while a node goes: poll again
                self.errors.append(repr(error)[:200])
            await asyncio.sleep(1.0)  # a child's actor lives its Turn (two steps) and 6 s idle after it

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def child_script(index: int, step_ms: tuple[int, int]) -> str:
    """A tool step (its reply committed before the tool runs), then the final reply."""
    tool_ms, final_ms = step_ms
    return script(call(("list_agents", {}), delay_ms=tool_ms), say(f"c{index} done", delay_ms=final_ms))


def root_script(step_ms: tuple[int, int]) -> str:
    return script(call(*(create(f"c{i}", child_script(i, step_ms)) for i in range(CHILDREN))),
                  call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(CHILDREN)]})),
                  say("all done"))


async def running_members(runtime: Runtime, tree_id: uuid.UUID) -> list[uuid.UUID]:
    found = await rows(runtime.db, "SELECT session_id FROM runs WHERE tree_id = %s AND status = 'running' "
                       "AND owner IS NOT NULL AND session_id <> %s", tree_id, tree_id)
    return [row["session_id"] for row in found]


async def call_nodes(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, list[str]]:
    """By member, the nodes whose gateways its model calls went through: where it ran (each node's
    sessions call their own node's gateway)."""
    calls = await rows(runtime.db, "SELECT DISTINCT r.session_id, c.node_id FROM model_calls c JOIN runs r "
                       "USING (run_id) WHERE r.tree_id = %s AND c.node_id IS NOT NULL", tree_id)
    nodes: dict[str, list[str]] = defaultdict(list)
    for call_row in calls:
        nodes[str(call_row["session_id"])].append(call_row["node_id"])
    return nodes


async def remove_a_worker_node(cluster: Cluster, runtime: Runtime, tree_id: uuid.UUID,
                               watch: ActorWatch) -> dict[str, Any]:
    """Remove a worker node whose actors run some of the children right now (not the sweeper's):
    seen there by Ray's actor table, or by the nodes of their model calls (on a loaded machine the
    state API may answer too late to see a Turn of a few seconds)."""
    workers = {node.node_id: node for node in cluster.worker_nodes}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the watch's own loop records the state API's errors
            await asyncio.wait_for(watch.poll(), 5)
        running = await running_members(runtime, tree_id)
        called_from = await call_nodes(runtime, tree_id)
        spared = watch.nodes[SWEEPER_NAME]
        on_node: dict[str, list[str]] = defaultdict(list)
        for member in running:
            for node_id in {*watch.nodes[runtime.placement.actor_name(member)], *called_from[str(member)]}:
                if node_id in workers and node_id not in spared:
                    on_node[node_id].append(str(member))
        if on_node:
            victim = max(on_node, key=lambda node_id: len(on_node[node_id]))
            # Killed, not shut down: a lost node's processes get no time to finish what they run.
            await asyncio.to_thread(cluster.remove_node, workers[victim], allow_graceful=False)
            after = set(map(str, await running_members(runtime, tree_id)))
            return {"node": victim, "members": on_node[victim], "running": len(running),
                    "still_running": sorted(after & set(on_node[victim]))}
        await asyncio.sleep(0.2)
    return {"node": None, "members": [], "running": 0}


async def tree_facts(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any]:
    sessions = await rows(runtime.db, "SELECT session_id, name FROM sessions WHERE tree_id = %s", tree_id)
    turns = await rows(runtime.db, "SELECT t.status FROM turns t JOIN sessions s USING (session_id) "
                       "WHERE s.tree_id = %s", tree_id)
    runs = await rows(runtime.db, "SELECT r.kind, r.status, r.error, r.owner IS NOT NULL AS taken, s.name "
                      "FROM runs r JOIN sessions s USING (session_id) WHERE r.tree_id = %s", tree_id)
    messages = await rows(runtime.db, "SELECT s.name, m.role, m.content, m.tool_calls IS NOT NULL AS calls "
                          "FROM thread_messages m JOIN sessions s USING (session_id) WHERE s.tree_id = %s", tree_id)
    replies: dict[str, list[str]] = defaultdict(list)
    tool_replies: dict[str, int] = defaultdict(int)
    tool_results: dict[str, int] = defaultdict(int)
    for message in messages:
        if message["role"] == "assistant" and message["calls"]:
            tool_replies[message["name"]] += 1
        elif message["role"] == "assistant":
            replies[message["name"]].append(message["content"])
        elif message["role"] == "tool":
            tool_results[message["name"]] += 1
    return {"members": {str(s["session_id"]): s["name"] for s in sessions},
            "turns": sorted(t["status"] for t in turns),
            "runs": sorted(f"{r['kind']}:{r['status']}" for r in runs),
            # Runs lost with their process; and grants no process took within a lease (a session
            # whose activation waited for Ray to declare the lost node's actors dead), recovered too.
            "lost_runs": sorted(r["name"] for r in runs if r["error"] == LEASE_EXPIRED and r["taken"]),
            "expired_grants": sorted(r["name"] for r in runs if r["error"] == LEASE_EXPIRED and not r["taken"]),
            "call_nodes": await call_nodes(runtime, tree_id), "replies": replies, "tool_replies": tool_replies,
            "tool_results": tool_results}


async def run_case(case: str, cluster: Cluster, runtime: Runtime, findings: dict[str, Any]) -> None:
    scope = Scope(f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}")
    watch = ActorWatch(ray.get_runtime_context().gcs_address)
    created = await runtime.create_root(scope, input_text=root_script(STEP_MS[case]))
    tree_id = created["session"]["session_id"]
    watch.start()
    try:
        if case == "node_lost":
            findings["removed"] = await remove_a_worker_node(cluster, runtime, tree_id, watch)
        started = time.monotonic()
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=240)
        findings["seconds_to_result"] = round(time.monotonic() - started, 1)  # from the removal, if any
        await runtime.wait_tree_idle(scope, tree_id, timeout=90)
    finally:
        watch.stop()
    findings["result"] = {"status": result["status"], "output": result["output"]}
    facts = await tree_facts(runtime, tree_id)
    findings.update(facts)
    # Where each member ran: the nodes of its model calls' gateways (durable), and wherever the
    # watch saw its actor (a short-lived actor can come and go between two polls of a busy machine).
    findings["member_nodes"] = {
        sid: sorted({*facts["call_nodes"].get(sid, []), *watch.nodes[runtime.placement.actor_name(uuid.UUID(sid))]})
        for sid in facts["members"]}
    findings["canopy_actors"] = {name: sorted(nodes) for name, nodes in watch.nodes.items()
                                 if name.startswith(("canopy:", "tree:"))}
    findings["watch_errors"] = watch.errors


def sweeper_on_the_head(settings: Settings, database_url: str, head: str) -> None:
    """Join the cluster and start the sweeper on the head, where the runtime then finds it: the
    node the scenario removes must not be its (a sweeper restarted elsewhere sweeps again, see
    tests/actors/test_schedules.py, but its restart would add seconds this scenario does not
    measure). Each node's model gateway starts with the first model call there and dies with it."""
    init_ray(settings, database_url)
    on_head = NodeAffinitySchedulingStrategy(head, soft=False)
    Sweeper.options(**named_options(SWEEPER_NAME), scheduling_strategy=on_head).remote()


async def main() -> None:
    cases = os.environ["SCENARIO_CASES"].split(",")
    for name in ("CANOPY_RAY_ADDRESS", "CANOPY_SECRETS_DIR", "CANOPY_DATABASE_URL"):
        os.environ.pop(name, None)
    os.environ["CANOPY_SESSION_SPREAD"] = "pack" if cases == ["pack"] else "spread"
    # The dashboard answers Ray's state API; other Rays on the machine may hold its port, 8265
    # (None: Ray tries the next ones).
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                            "dashboard_host": "127.0.0.1", "dashboard_port": None})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    nodes = {"head": cluster.head_node.node_id, "workers": [node.node_id for node in cluster.worker_nodes]}
    findings: dict[str, Any] = {}
    try:
        database_url = os.environ["SCENARIO_DATABASE_URL"]
        settings = Settings(ray_address=cluster.address, database_url=SecretStr(database_url))
        sweeper_on_the_head(settings, database_url, cluster.head_node.node_id)
        runtime = await Runtime.start(settings)
        for case in cases:
            findings[case] = {"case": case, **nodes, "shape": type(runtime.placement).__name__}
            await run_case(case, cluster, runtime, findings[case])
        await runtime.close()
    except BaseException:
        findings["error"] = traceback.format_exc(limit=6)
        raise
    finally:
        print("FINDINGS " + json.dumps(findings), flush=True)  # what was found, even before a failure
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
