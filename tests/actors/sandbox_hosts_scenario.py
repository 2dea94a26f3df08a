"""A tree's sandbox on a Ray cluster of two nodes (``ray.cluster_utils.Cluster``, both on this machine)
with one database: the tree's first command, from a session on the second node, makes its sandbox
there; the same session moved to the head runs its next command in that sandbox (the second node's
sandbox host); another tree's first sandbox call, a file write on the second node, puts its sandbox
there too; a user whose limit of sandboxes is reached by idle ones on the second node gets one on
the head (the second node's host releases one); a call that finds a tree's node gone just after
another member moved the lease to the second node goes there; the second node is removed, and the
next command from the head is told the workdir was lost and runs in a new sandbox on the head. Run by
test_sandbox_hosts.py (one Ray per process); prints one JSON line. The local backend
(CANOPY_SANDBOX_BACKEND=local, set by the test).

    CANOPY_DATA_DIR=... SCENARIO_DATABASE_URL=... python -m tests.actors.sandbox_hosts_scenario
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster

from actors import sandbox_hosts as hosts
from actors.hosting import SHAPE_ACTORS
from actors.naming import NAMESPACE, node_local_options, sandbox_host_name, session_actor_name
from actors.runtime import Runtime
from actors.scripted import call, say, script
from persistence import sandbox_leases as leases
from persistence.databases import rows
from persistence.records import Scope
from persistence.settings import Settings
from tests.actors.gateways_scenario import actors, session_on, until
from tests.ports import free_port

FIRST = 'echo first > "$CANOPY_TMP/marker" && echo from-node-2 > note.txt && echo started'
AGAIN = 'cat "$CANOPY_TMP/marker" note.txt'


def command(text: str) -> str:
    """A Turn that runs ``text`` and answers the whole tool result, as JSON."""
    return script(call(("run_command", {"command": text})), say("${0}"))


async def answer(runtime: Runtime, scope: Scope, input_id: uuid.UUID) -> dict[str, Any]:
    result = await runtime.wait_result(scope, input_id, timeout=60)
    return json.loads(result["output"]) if result["status"] == "completed" else {"status": result["status"]}


async def lease(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any] | None:
    found = await rows(runtime.db, "SELECT state, handle, node_id, workdir_lost_at IS NOT NULL AS lost "
                       "FROM sandbox_leases WHERE tree_id = %s", tree_id)
    return found[0] if found else None


async def swept(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any] | None:
    """The lease once it is no longer active (the sweeper's doing), or None if it stays active for a minute."""
    for _ in range(120):
        found = await lease(runtime, tree_id)
        if found["state"] != "active":
            return found
        await asyncio.sleep(0.5)
    return None


def sandbox_hosts() -> dict[str, str]:
    """Alive sandbox hosts by node, from Ray's actor table."""
    return {actor.name: actor.node_id for actor in actors("canopy:sandbox:") if actor.state == "ALIVE"}


async def move_session(session_id: uuid.UUID, node_id: str) -> str:
    """Kill the session's actor and make it again pinned to ``node_id`` (it rebuilds from the database)."""
    name = session_actor_name(session_id)
    ray.kill(ray.get_actor(name, namespace=NAMESPACE))
    await until(lambda: not [a for a in actors(name) if a.state != "DEAD"], timeout=30)
    actor = SHAPE_ACTORS.session.options(**node_local_options(name, node_id)).remote(str(session_id))
    return str((await actor.status.remote())["owner"])


async def raced_route(runtime: Runtime, tree_id: uuid.UUID, gone: str, other: str) -> dict[str, Any]:
    """Where ``host_for`` sends a call that finds the tree's node ``gone`` lost just as another member,
    on node ``other``, has moved the lease there: that member's move commits between this call's read
    of the lease and its own move (played here at the one point between them)."""
    existing = hosts._existing_host

    async def moved_first(node_id: str) -> Any:
        if node_id == gone:
            async with runtime.db.tx() as conn:
                assert await leases.move_lost(conn, tree_id, gone, other)
        return await existing(node_id)

    hosts._existing_host = moved_first
    try:
        host, lost = await hosts.host_for(runtime.db, tree_id, tree_id)
    finally:
        hosts._existing_host = existing
    on_other = host._actor_id == ray.get_actor(sandbox_host_name(other), namespace=NAMESPACE)._actor_id
    return {"host": "other" if on_other else "not other", "lost": lost}


async def main() -> None:
    os.environ.pop("CANOPY_SECRETS_DIR", None)
    os.environ["CANOPY_SESSION_HOSTS"] = "0"  # a session's own actor: where its Runs execute is in the actor table
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                            "dashboard_port": free_port()})
    second = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    findings: dict[str, Any] = {}
    try:
        settings = Settings(ray_address=cluster.address, database_url=SecretStr(os.environ["SCENARIO_DATABASE_URL"]))
        runtime = await Runtime.start(settings)
        head = ray.get_runtime_context().get_node_id()
        other = second.node_id
        findings.update(head=head, other=other)
        scope = Scope(f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}")

        started = await session_on(runtime, scope, other, command(FIRST))
        tree_id = started["session_id"]
        findings["first"] = await answer(runtime, scope, started["input_id"])
        findings["first_lease"] = await lease(runtime, tree_id)
        findings["hosts_after_first"] = sandbox_hosts()

        await move_session(tree_id, head)
        receipt = await runtime.submit_input(scope, tree_id, command(AGAIN))
        findings["second"] = await answer(runtime, scope, receipt["input_id"])
        findings["second_lease"] = await lease(runtime, tree_id)
        findings["session_node"] = sorted({a.node_id for a in actors(session_actor_name(tree_id))
                                           if a.state == "ALIVE"})

        # Another tree's first sandbox call is a file write, from a session on the second node; its
        # first command then comes from the head.
        pinned = await session_on(runtime, scope, other, script(
            call(("write_file", {"path": "pinned.txt", "content": "written on node 2"})), say("${0.bytes}")))
        findings["pinned_write"] = (await runtime.wait_result(scope, pinned["input_id"], timeout=60))["output"]
        findings["pinned_lease"] = await lease(runtime, pinned["session_id"])
        await move_session(pinned["session_id"], head)
        receipt = await runtime.submit_input(scope, pinned["session_id"], command("cat pinned.txt"))
        findings["pinned_run"] = await answer(runtime, scope, receipt["input_id"])
        findings["pinned_run_lease"] = await lease(runtime, pinned["session_id"])

        # A user's limit of sandboxes (CANOPY_SANDBOX_MAX_PER_SCOPE=2, set by the test) counts every node:
        # another user's two idle trees on the second node, then a third tree of theirs on the head.
        limited = Scope(f"user-{uuid.uuid4().hex[:8]}", scope.app_id)
        older, newer = [await session_on(runtime, limited, other, command(f"echo {name}")) for name in ("a", "b")]
        for started in (older, newer):
            await answer(runtime, limited, started["input_id"])
        async with runtime.db.tx() as conn:  # idle past a claim's grace (10 s), the older one the longer
            for started, seconds in ((older, 60), (newer, 30)):
                await conn.execute("UPDATE sandbox_leases SET last_used_at = now() - make_interval(secs => %s) "
                                   "WHERE tree_id = %s", (seconds, started["session_id"]))
        third = await session_on(runtime, limited, head, command("echo third"))
        findings["limited_third"] = await answer(runtime, limited, third["input_id"])
        findings["limited_leases"] = [await lease(runtime, started["session_id"]) for started in (older, newer, third)]

        # Two members of a tree find its node gone at once, and the one on the second node moves the
        # lease first: the other's call goes to the second node's host (its own node's would refuse it).
        raced = await runtime.create_root(scope, input_text=script(say("made")))
        raced_id = raced["session"]["session_id"]
        async with runtime.db.tx() as conn:
            await leases.pin_node(conn, raced_id, "local", "dd" * 28)
        findings["raced"] = await raced_route(runtime, raced_id, "dd" * 28, other)
        findings["raced_lease"] = await lease(runtime, raced_id)

        cluster.remove_node(second)
        await until(lambda: not any(node["Alive"] for node in ray.nodes() if node["NodeID"] == other), timeout=30)
        # Both nodes are this machine's: what the removed node held on its disk goes by hand.
        shutil.rmtree(findings["first_lease"]["handle"])
        workdir = (await rows(runtime.db, "SELECT p.workdir FROM projects p JOIN sessions s USING (project_id) "
                              "WHERE s.session_id = %s", tree_id))[0]["workdir"]
        shutil.rmtree(workdir)
        # With no command of the tree meanwhile, the sweeper finds the sandbox gone with its node.
        findings["swept_lease"] = await swept(runtime, tree_id)

        receipt = await runtime.submit_input(scope, tree_id, command(AGAIN))
        findings["third"] = await answer(runtime, scope, receipt["input_id"])
        findings["third_lease"] = await lease(runtime, tree_id)
        findings["hosts_after_loss"] = sandbox_hosts()
        findings["receipts"] = [row["result"] for row in await rows(
            runtime.db, "SELECT r.result FROM tool_receipts r JOIN turns t USING (turn_id) "
            "WHERE t.session_id = %s ORDER BY r.created_at", tree_id)]
        findings["workdir_exists"] = Path(workdir).is_dir()
        await runtime.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
        print("FINDINGS " + json.dumps(findings, default=str), flush=True)  # what was found, even before a failure


if __name__ == "__main__":
    asyncio.run(main())
