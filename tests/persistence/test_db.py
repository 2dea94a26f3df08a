"""The pool a process opens on first use is opened once, whatever the number of first callers."""

from __future__ import annotations

import asyncio

from persistence.db import LazyDatabase


async def test_concurrent_first_uses_open_one_pool(database_url: str) -> None:
    lazy = LazyDatabase(database_url, max_size=2)
    try:
        opened = await asyncio.gather(*(lazy.get() for _ in range(10)))
        assert len({id(db) for db in opened}) == 1
        async with opened[0].tx() as conn:
            cur = await conn.execute("SELECT 1 AS one")
            assert await cur.fetchone() == {"one": 1}
    finally:
        await lazy.close()
