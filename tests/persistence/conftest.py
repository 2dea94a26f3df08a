"""The persistence suite gets a database of its own.

Its rejection tests count whole tables before and after; sharing the database with the
actor runtime (whose sweeper and actors keep writing in the background) would make those
counts move for reasons that have nothing to do with the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from persistence.databases import create_database
from persistence.db import Database


@pytest.fixture(scope="session")
def database_url(database_url: str) -> str:
    return create_database(database_url, "canopy_persistence")


@pytest.fixture(scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await Database.connect(database_url, max_size=8)
    yield database
    await database.close()
