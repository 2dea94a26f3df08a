"""One sandbox manager per process and Database object, never a dead Database's manager."""

from __future__ import annotations

import gc

from actors.sandbox_tools import sandbox_manager
from persistence.db import Database


async def test_each_database_gets_its_own_manager(database_url: str) -> None:
    seen = []
    for _ in range(20):  # objects made and dropped in a loop tend to reuse the same memory (and id)
        db = await Database.connect(database_url, max_size=1)
        manager = await sandbox_manager(db)
        assert manager.db is db
        assert await sandbox_manager(db) is manager
        seen.append(manager)
        await db.close()
        del db
        gc.collect()
    assert len({id(m) for m in seen}) == len(seen)
