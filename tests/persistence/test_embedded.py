"""The embedded PostgreSQL (persistence/embedded.py, persistence/pgserver_compat.py) started by root,
which pgserver runs as a user of its own: that user must reach the data directory, and no directory
above it becomes listable or readable by other users (pgserver made root's home both)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psycopg
import pytest

from persistence.embedded import embedded_url, stop_embedded


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
