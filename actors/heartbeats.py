"""The lease renewals of every Run a process executes: one statement per beat, whatever their number.

A Run is presumed dead when its lease runs out, so its renewal must not wait behind the work of
the sessions it shares a process with: a session host's pool can be taken whole by transactions
waiting on locks (each up to ``CANOPY_DB_LOCK_TIMEOUT_SECONDS``), and a healthy Run behind them
would be recovered as dead. A host's beats therefore go through a connection of their own; a
dedicated session's process runs one Run at a time and beats through its own pool, which only that
Run uses. One statement renews every Run of the process (a host of 100 running sessions makes one
write a beat, not 100).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

from persistence import runs as run_repo
from persistence.db import Database
from persistence.records import RunRef
from persistence.settings import Settings
from persistence.statuses import TurnStatus

log = logging.getLogger(__name__)


class Heartbeats:
    """Renews the leases of the Runs held here every ``heartbeat_seconds``; a Run whose lease was
    lost, or whose Turn is being cancelled, is told by its ``stop`` (its incarnation must stop acting
    at once: the cancel's signal may have been lost while a command or model call runs on)."""

    def __init__(self, database: Callable[[], Awaitable[Database]], settings: Settings) -> None:
        self._database = database
        self._settings = settings
        self._held: dict[uuid.UUID, tuple[RunRef, Callable[[], object]]] = {}
        self._beating: asyncio.Task[None] | None = None

    def hold(self, run: RunRef, stop: Callable[[], object]) -> None:
        self._held[run.run_id] = (run, stop)
        if self._beating is None or self._beating.done():
            self._beating = asyncio.create_task(self._beat_forever())

    def release(self, run: RunRef) -> None:
        self._held.pop(run.run_id, None)

    def close(self) -> None:
        if self._beating is not None:
            self._beating.cancel()

    async def _beat_forever(self) -> None:
        while self._held:
            await asyncio.sleep(self._settings.heartbeat_seconds)
            await self.beat()

    async def beat(self) -> None:
        """Renew every lease held here now; stop the Runs that must stop. A failure (the database
        restarting) is logged and the next beat tries again: a lease outlives two beats."""
        asked = list(self._held.values())
        if not asked:
            return
        try:
            db = await self._database()
            async with db.tx() as conn:
                held = await run_repo.heartbeat(conn, [run for run, _ in asked], self._settings.lease_seconds,
                                                busy_wait_seconds=self._settings.heartbeat_seconds / 2)
        except Exception:
            log.exception("the heartbeat of %d runs failed", len(asked))
            return
        for entry in asked:
            run, stop = entry
            # Only the execution asked about: one that ended meanwhile is gone, and the same Run held
            # again (handed back and taken up by the same incarnation) is another entry.
            if held.get(run.run_id) in (None, TurnStatus.CANCELLING) and self._held.get(run.run_id) is entry:
                del self._held[run.run_id]
                stop()
