"""The recovery sweeper: re-derives every lost hint from the durable facts.

On start and every ``sweep_seconds`` it recovers Runs whose lease expired, resumes
waits whose condition or deadline is met, pokes trees with queued Runs, and
re-activates sessions holding a granted but unowned Run. Each record is handled in its
own transaction; one failing record is logged and skipped, the rest proceed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import ray

from actors import signals
from persistence import runs as run_repo
from persistence import turns, waits
from persistence.db import Database
from persistence.settings import get_settings

log = logging.getLogger(__name__)

_TREES_WITH_QUEUED_RUNS = "SELECT DISTINCT tree_id FROM runs WHERE status = 'pending'"
_UNOWNED_GRANTS = """
SELECT DISTINCT session_id FROM runs
WHERE status = 'running' AND owner IS NULL AND started_at < now() - make_interval(secs => %s)
"""


class SweeperImpl:
    def __init__(self) -> None:
        self.settings = get_settings()
        self._db: Database | None = None
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.recoveries = 0

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())

    async def stats(self) -> dict[str, int]:
        return {"rounds": self.rounds, "recoveries": self.recoveries}

    async def _loop(self) -> None:
        self._db = await Database.connect(max_size=2)
        while True:
            try:
                await self.sweep_once()
            except Exception:
                log.exception("sweep round failed")
            await asyncio.sleep(self.settings.sweep_seconds)

    async def sweep_once(self) -> None:
        db = self._db or await Database.connect(max_size=2)
        self._db = db
        async with db.tx() as conn:
            expired = await run_repo.expired_runs(conn)
        await _each(expired, lambda run_id: self._recover(db, run_id))
        async with db.tx() as conn:
            open_waits = await waits.open_waits(conn)
        await _each(open_waits, lambda wait_id: signals.resume_wait(db, wait_id))
        async with db.tx() as conn:
            cur = await conn.execute(_TREES_WITH_QUEUED_RUNS)
            queued_trees = [row["tree_id"] for row in await cur.fetchall()]
            cur = await conn.execute(_UNOWNED_GRANTS, (self.settings.heartbeat_seconds,))
            unowned = [row["session_id"] for row in await cur.fetchall()]
        signals.poke_trees(queued_trees)
        await _each(unowned, signals.activate_session)
        self.rounds += 1

    async def _recover(self, db: Database, run_id: uuid.UUID) -> None:
        async with db.tx() as conn:
            recovered = await turns.recover_expired_run(conn, run_id)
        if recovered:
            self.recoveries += 1
            log.warning("recovered run %s of session %s", run_id, recovered["session_id"])
            await signals.after_change(db, [recovered["session_id"]])


async def _each(records: list[uuid.UUID], handle: Callable[[uuid.UUID], Awaitable[None]]) -> None:
    for record in records:
        try:
            await handle(record)
        except Exception:
            log.exception("sweep of %s failed; continuing with the rest", record)


Sweeper = ray.remote(SweeperImpl)
