"""TreeSupervisor: one per active tree, named ``tree:<tree_id>``.

Grants the tree's slots FIFO. The grant is serialised here in memory and committed in
PostgreSQL under the tree's row lock, so the limit holds across supervisor restarts,
API replicas and nodes. A Run that cannot be served stays ``pending`` in the durable
queue; it is never dropped. The supervisor passivates when its tree is idle.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import ray

from actors import signals
from persistence import runs as run_repo
from persistence.db import Database
from persistence.settings import get_settings

log = logging.getLogger(__name__)

_ACTIVE_RUNS = "SELECT count(*) AS n FROM runs WHERE tree_id = %s AND status IN ('pending', 'running')"


class TreeSupervisorImpl:
    def __init__(self, tree_id: str) -> None:
        self.tree_id = uuid.UUID(tree_id)
        self.settings = get_settings()
        self._db: Database | None = None
        self._lock = asyncio.Lock()
        self._idle_task: asyncio.Task[None] | None = None

    async def _database(self) -> Database:
        if self._db is None:
            self._db = await Database.connect(max_size=2)
        return self._db

    async def poke(self) -> list[str]:
        """Grant free slots to the oldest pending Runs and activate their sessions."""
        if self._idle_task is None or self._idle_task.done():
            self._idle_task = asyncio.create_task(self._passivate_when_idle())
        return await self._grant()

    async def _grant(self) -> list[str]:
        db = await self._database()
        async with self._lock:
            async with db.tx() as conn:
                granted = await run_repo.grant_slots(conn, self.tree_id, self.settings.lease_seconds)
        await asyncio.gather(*(signals.activate_session(row["session_id"]) for row in granted))
        return [str(row["run_id"]) for row in granted]

    async def signal_members(self, session_ids: list[str]) -> None:
        """After a stop or cancel: tell the members' live Runs to re-read their Turns."""
        await asyncio.gather(*(signals.activate_session(uuid.UUID(s)) for s in session_ids))

    async def _passivate_when_idle(self) -> None:
        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.sweep_seconds)
            db = await self._database()
            async with db.tx() as conn:
                cur = await conn.execute(_ACTIVE_RUNS, (self.tree_id,))
                row = await cur.fetchone()
            if row and row["n"]:
                idle_since = None
                await self._grant()
                continue
            idle_since = idle_since or loop.time()
            if loop.time() - idle_since >= self.settings.actor_idle_seconds:
                await db.close()
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return


TreeSupervisor = ray.remote(TreeSupervisorImpl)
