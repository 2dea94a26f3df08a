"""The embedded PostgreSQL (persistence/embedded.py, persistence/pgserver_compat.py) started by root,
which pgserver runs as a user of its own: that user must reach the data directory, and no directory
above it becomes listable or readable by other users (pgserver made root's home both)."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from persistence import pgserver_compat
from persistence.embedded import embedded_url, pgdata, running_postmaster, stop_embedded


def test_roots_embedded_database_leaves_the_directories_above_it_private(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("pgserver runs PostgreSQL as a user of its own only when started by root")
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o700)
    data_dir = home / ".canopy"
    try:
        with psycopg.connect(embedded_url(data_dir)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        stop_embedded(data_dir)
    assert stat.S_IMODE(home.stat().st_mode) == 0o711  # reachable, neither listable nor readable


def _connect_as_nobody(socket_path: Path) -> subprocess.CompletedProcess[str]:
    """Another local user's attempt on the server's socket: the system Python (the venv may be
    unreachable to ``nobody``) connecting to it as ``nobody``."""
    nobody = pwd.getpwnam("nobody")

    def become_nobody() -> None:
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    probe = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print('connected')"
    return subprocess.run(["/usr/bin/python3", "-I", "-c", probe, str(socket_path)], capture_output=True,
                          text=True, timeout=30, preexec_fn=become_nobody, cwd="/")


@pytest.mark.parametrize("name_length", [8, 100], ids=["short-path", "long-path"])
def test_no_other_local_user_reaches_the_embedded_database_whatever_the_data_dirs_length(
        tmp_path: Path, name_length: int) -> None:
    """Its socket lies in a directory of the server's user only (0700), and is its user's only
    (unix_socket_permissions 0700): a data dir too long for a socket path (sun_path holds 107 bytes)
    no longer moves it to a directory every user may enter and write (pgserver's /tmp/<hash>, 0777)."""
    if os.geteuid() != 0:
        pytest.skip("connecting as another user needs root")
    data_dir = tmp_path / ("d" * max(1, name_length - len(str(tmp_path)) - 1))
    assert len(str(data_dir)) >= name_length
    try:
        url = embedded_url(data_dir)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        socket_dir = Path(parse_qs(urlsplit(url).query)["host"][0])
        socket_path = socket_dir / ".s.PGSQL.5432"
        assert len(os.fsencode(socket_path)) <= 107
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o700
        attempt = _connect_as_nobody(socket_path)
        assert attempt.returncode != 0 and "PermissionError" in attempt.stderr, attempt
    finally:
        stop_embedded(data_dir)
    if socket_dir != data_dir.resolve() / "pg":
        assert not socket_dir.exists()  # a directory of its own for the socket goes with the server


def test_stopping_an_embedded_database_that_does_not_run_creates_and_starts_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-started"
    stop_embedded(data_dir)
    assert not data_dir.exists()


def test_a_server_that_fails_to_start_leaves_no_socket_directory_behind(tmp_path: Path) -> None:
    """A data dir too long for a socket path gets a /tmp/canopy-pg-* directory for the socket as the
    server starts; when pg_ctl failed (here a setting PostgreSQL refuses), that directory stayed. The
    directory is made here, as embedded.py makes it, so that no other test's can be taken for it."""
    data_dir = tmp_path / ("d" * 100)
    data_dir.mkdir()
    handle = pgserver_compat.server(pgdata(data_dir))
    pgserver_compat.init_pgdata(handle)
    with (pgdata(data_dir) / "postgresql.conf").open("a") as conf:
        conf.write("\nshared_buffers = plenty\n")
    made: list[Path] = []

    def socket_dir() -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="canopy-pg-", dir="/tmp")))
        return made[-1]

    try:
        with pytest.raises(subprocess.CalledProcessError):
            pgserver_compat.start(handle, socket_dir)
    finally:
        stop_embedded(data_dir)
    assert len(made) == 1 and not made[0].exists()
    assert running_postmaster(data_dir) is None
