"""SessionActor: one per *active* session, named ``session:<session_id>``.

It keeps no state that matters: its mailbox holds hints, and on every hint it re-reads
the durable facts (runs granted to this session and not yet owned). An idle actor
passivates after ``actor_idle_seconds``; it is re-activated on demand, and rebuilding
it is the same code path as after a crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

import ray

from actors.agent_loop import RunExecutor
from actors.naming import GATEWAY_NAME, NAMESPACE
from persistence import runs as run_repo
from persistence.db import Database
from persistence.settings import get_settings

log = logging.getLogger(__name__)


class SessionActorImpl:
    def __init__(self, session_id: str) -> None:
        self.session_id = uuid.UUID(session_id)
        # One lease owner per incarnation: a restarted actor never writes as its predecessor.
        self.owner = f"session:{session_id}:{uuid.uuid4().hex[:12]}"
        self.settings = get_settings()
        self._db: Database | None = None
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._current: asyncio.Task[None] | None = None
        self._current_turn: uuid.UUID | None = None

    async def _database(self) -> Database:
        if self._db is None:
            self._db = await Database.connect(max_size=2)
        return self._db

    async def signal(self) -> bool:
        """A hint: there may be work, a cancellation, or a stop. Re-read the facts."""
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._main())
        self._wake.set()
        await self._cancel_if_requested()
        return True

    async def status(self) -> dict[str, str | int | None]:
        return {"owner": self.owner, "pid": os.getpid(),
                "turn_id": str(self._current_turn) if self._current_turn else None}

    async def _cancel_if_requested(self) -> None:
        if self._current is None or self._current.done() or self._current_turn is None:
            return
        db = await self._database()
        async with db.tx() as conn:
            cur = await conn.execute("SELECT status FROM turns WHERE turn_id = %s", (self._current_turn,))
            turn = await cur.fetchone()
        if turn is not None and turn["status"] == "cancelling":
            self._current.cancel()

    async def _main(self) -> None:
        while True:
            self._wake.clear()
            if await self._run_claimable():
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.actor_idle_seconds)
            except TimeoutError:
                if not await self._run_claimable():
                    await self._passivate()
                    return

    async def _run_claimable(self) -> bool:
        db = await self._database()
        async with db.tx() as conn:
            run_ids = await run_repo.claimable_runs(conn, self.session_id)
        ran = False
        for run_id in run_ids:
            async with db.tx() as conn:
                run = await run_repo.acquire_run(conn, run_id, self.owner, self.settings.lease_seconds)
            if run is None:
                continue
            ran = True
            gateway = ray.get_actor(GATEWAY_NAME, namespace=NAMESPACE)
            self._current_turn = run.turn_id
            self._current = asyncio.create_task(RunExecutor(db, self.settings, gateway, run).execute())
            try:
                await self._current
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("run %s crashed; its lease will expire and it will be resumed", run_id)
            finally:
                self._current = None
                self._current_turn = None
        return ran

    async def _passivate(self) -> None:
        log.info("session %s idle: passivating", self.session_id)
        if self._db is not None:
            await self._db.close()
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


SessionActor = ray.remote(SessionActorImpl)
