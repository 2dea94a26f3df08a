"""Shared fixtures: one real PostgreSQL database per test run, a fresh scope per test.

The database is ``CANOPY_DATABASE_URL`` when set (a new database is created in that
server), else the embedded server started in a temporary data directory.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from persistence.db import Database, ensure_schema
from persistence.embedded import embedded_url, stop_embedded
from persistence.records import Scope

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


@pytest.fixture(scope="session")
def data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="canopy-test-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def database_url(data_dir: Path) -> Iterator[str]:
    external = os.environ.get("CANOPY_DATABASE_URL")
    server_url = external or embedded_url(data_dir)
    name = f"canopy_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _with_database(server_url, name)
    ensure_schema(url)
    yield url
    if not external:
        stop_embedded(data_dir)


@pytest.fixture(scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await Database.connect(database_url, max_size=8)
    yield database
    await database.close()


@pytest.fixture
def scope() -> Scope:
    """A scope of its own for every test, so tests never see each other's rows."""
    return Scope(f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}")
