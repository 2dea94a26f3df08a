"""Canopy on a Ray cluster of two nodes (``ray.cluster_utils.Cluster``, both on this machine):
without a database URL, joining it, starting the runtime in a connected driver, and resolving
the database in a worker on either node are all refused before any PostgreSQL starts; with one,
the runtime starts. Run by test_cluster_database.py (one Ray per process, so not in the test
session's); prints one JSON line of findings.

    CANOPY_DATA_DIR=... SCENARIO_DATABASE_URL=... python -m tests.actors.cluster_database_scenario
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import psutil
import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster

from actors.gateways import gateway_on
from actors.naming import NAMESPACE
from actors.runtime import Runtime
from persistence.db import resolve_database_url
from persistence.errors import SharedDatabaseRequired
from persistence.settings import Settings


def refusal(error: BaseException | None) -> dict[str, Any]:
    return {"type": type(error).__name__, "message": str(error)} if error else {"type": None}


async def start_runtime(settings: Settings) -> dict[str, Any]:
    try:
        runtime = await Runtime.start(settings)
    except SharedDatabaseRequired as error:
        return refusal(error)
    await runtime.close()
    return {"type": None, "gateway": gateway_on(ray.get_runtime_context().get_node_id()) is not None}


@ray.remote(num_cpus=0)
def resolve_in_worker() -> dict[str, Any]:
    """What a worker that found no database URL on its node gets (the settings of its environment)."""
    try:
        resolve_database_url(Settings())
    except SharedDatabaseRequired as error:
        return refusal(error)
    return {"type": None}


def postgres_processes(data_dir: Path) -> list[str]:
    """Command lines of PostgreSQL servers of this data dir (other servers run on the machine too)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["name"] in ("postgres", "postmaster") and str(data_dir) in cmdline:
            found.append(cmdline)
    return found


async def main() -> None:
    # No database configured, here or in the nodes' processes (they inherit this environment).
    for name in ("CANOPY_DATABASE_URL", "CANOPY_SECRETS_DIR", "CANOPY_RAY_ADDRESS"):
        os.environ.pop(name, None)
    data_dir = Path(os.environ["CANOPY_DATA_DIR"]).resolve()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "resources": {"head_node": 1}})
    cluster.add_node(num_cpus=1, resources={"other_node": 1})
    cluster.wait_for_nodes()
    findings: dict[str, Any] = {}
    try:
        findings["join"] = await start_runtime(Settings(ray_address=cluster.address))
        findings["joined_ray"] = ray.is_initialized()
        ray.shutdown()
        ray.init(address=cluster.address, namespace=NAMESPACE)
        findings["connected_driver"] = await start_runtime(Settings())
        findings["workers"] = {node: ray.get(resolve_in_worker.options(resources={node: 0.01}).remote())
                               for node in ("head_node", "other_node")}
        findings["postgres"] = postgres_processes(data_dir)
        findings["pg_dir"] = (data_dir / "pg").exists()
        ray.shutdown()
        findings["with_url"] = await start_runtime(Settings(
            ray_address=cluster.address, database_url=SecretStr(os.environ["SCENARIO_DATABASE_URL"])))
    finally:
        ray.shutdown()
        cluster.shutdown()
        print("FINDINGS " + json.dumps(findings), flush=True)  # what was found, even before a failure


if __name__ == "__main__":
    asyncio.run(main())
