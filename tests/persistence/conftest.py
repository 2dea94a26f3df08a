"""The persistence suite gets a database of its own.

Its rejection tests count whole tables before and after; sharing the database with the
actor runtime (whose sweeper and actors keep writing in the background) would make those
counts move for reasons that have nothing to do with the test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg import sql

from persistence.db import Database, ensure_schema


@pytest.fixture(scope="session")
def database_url(database_url: str) -> str:
    name = f"canopy_persistence_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(database_url, dbname=name)
    ensure_schema(url)
    return url


@pytest.fixture(scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await Database.connect(database_url, max_size=8)
    yield database
    await database.close()
