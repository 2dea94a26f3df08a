"""The tree supervisor: one per active tree (``tree:<tree_id>`` in the dedicated shape).

Grants the tree's slots FIFO. The grant is serialised here in memory and committed in
PostgreSQL under the tree's row lock, so the limit holds across supervisor restarts,
API replicas and nodes. A Run that cannot be served stays ``pending`` in the durable
queue; it is never dropped. The supervisor passivates when its tree is idle (at once when the
host it lives in moves).

Pokes coalesce: a poke that arrives while a grant is committing waits for it and then
grants once more for everyone who arrived meanwhile, so a burst of N pokes costs at most
two grant transactions. ``poke`` answers as soon as the grant is committed; activating
the granted sessions continues in the background (a supervisor that dies in between
leaves granted, unowned Runs, which the sweeper re-activates).

Where it lives is the placement's choice (actors/placement.py): an actor of its own, or
inside the host of the tree's root session (a new process per tree costs ~0.5 s of CPU on
a small machine, more than a whole wave of model calls). Both run this ``SupervisorCore``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from actors import signals
from actors.placement import Placement, spawn
from persistence import runs as run_repo
from persistence.db import Database
from persistence.settings import get_settings

log = logging.getLogger(__name__)


class SupervisorCore:
    """One tree's grants and idle passivation, in whichever process hosts it."""

    def __init__(self, tree_id: uuid.UUID, placement: Placement) -> None:
        self.tree_id = tree_id
        self.placement = placement
        self.settings = get_settings()
        self._lock = asyncio.Lock()
        self._dirty = False
        self._pokes = 0
        self.exiting = False
        self._idle_task: asyncio.Task[None] | None = None

    # -- what the host provides ----------------------------------------------------------------------

    async def _database(self) -> Database:
        raise NotImplementedError

    async def _exited(self, db: Database) -> None:
        """Passivation decided: release what this supervisor holds in its host."""
        raise NotImplementedError

    # -- grants ----------------------------------------------------------------------------------------

    async def poke(self) -> list[str] | None:
        """Grant free slots to the oldest pending Runs and activate their sessions.

        None means this supervisor is exiting: the caller creates it anew and pokes again.
        """
        if self.exiting:
            return None
        if self._idle_task is None or self._idle_task.done():
            self._idle_task = asyncio.create_task(self._passivate_when_idle())
        return await self._grant()

    async def _grant(self) -> list[str]:
        self._pokes += 1
        self._dirty = True
        db = await self._database()
        async with self._lock:
            if not self._dirty:  # a grant that started after our poke arrived already served it
                return []
            self._dirty = False
            async with db.tx() as conn:
                granted = await run_repo.grant_slots(conn, self.tree_id, self.settings.lease_seconds)
        for row in granted:
            spawn(signals.activate_granted(self.placement, db, row["session_id"]))
        return [str(row["run_id"]) for row in granted]

    async def _passivate_when_idle(self) -> None:
        idle_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.sweep_seconds)
            pokes = self._pokes
            try:
                db = await self._database()
                async with db.tx() as conn:
                    active = await run_repo.tree_has_active_runs(conn, self.tree_id)
                if active:
                    idle_since = None
                    await self._grant()
                    continue
            except Exception:  # a database that restarted: each pooled connection fails once
                log.exception("tree %s's supervisor could not look at its tree; it looks again", self.tree_id)
                idle_since = None
                continue
            idle_since = idle_since or loop.time()
            if self._pokes != pokes or self._lock.locked():
                idle_since = None  # a poke arrived meanwhile: not idle after all
            elif loop.time() - idle_since >= self.settings.actor_idle_seconds:
                await self._exit(db)
                return

    async def passivate_now(self) -> None:
        """Exit whatever the tree is doing (its host moves, actors/hosting.py): the tree's queue and
        slots are in the database, and its next poke makes the supervisor anew where it now lives.
        A grant under way commits first."""
        async with self._lock:
            if not self.exiting:
                await self._exit(await self._database())

    async def _exit(self, db: Database) -> None:
        # Called with no await since the idle check: from this flag on every poke is refused (its
        # sender creates a fresh supervisor), so none is accepted and then lost.
        self.exiting = True
        if self._idle_task is not None and self._idle_task is not asyncio.current_task():
            self._idle_task.cancel()
        await self._exited(db)
