"""A session: one per *active* session, in whichever process the placement puts it.

A session keeps no state that matters: its mailbox holds hints, and on every hint it
re-reads the durable facts (runs granted to this session and not yet owned). An idle
session passivates after ``actor_idle_seconds``, or earlier when its node's directory
needs room under ``max_live_sessions`` (least recently used first); it is re-activated
on demand, and rebuilding it is the same code path as after a crash.

Both shapes (actors/placement.py: a dedicated actor ``session:<id>``, or a task of that
name in a shared host) run this ``SessionCore``: the same mailbox, lease owner per
incarnation, passivation and reports to the directory. Sessions stay small: no model client
(the ModelGateway is the only importer of litellm), and cached lookups of their node's gateway
(actors/gateways.py) and directory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from typing import Any

import ray

from actors import directory
from actors.agent_loop import RunExecutor
from actors.heartbeats import Heartbeats
from actors.placement import Placement
from persistence import runs as run_repo
from persistence import turns
from persistence.db import Connection, Database
from persistence.settings import get_settings
from persistence.statuses import TurnStatus

log = logging.getLogger(__name__)


@functools.cache
def this_actor() -> Any:
    """The handle of the actor this process runs (one for the process's life; building it is a
    lookup in Ray's runtime context, too slow for every report)."""
    return ray.get_runtime_context().current_actor


async def wait_for_run(run: asyncio.Task[None], *, exiting: bool = False) -> None:
    """Wait for a Run's task. The Run's own cancellation (its Turn was cancelled) ends it and the
    session's loop goes on; a cancellation of the waiting loop itself (a shutdown, a passivation)
    propagates, so the loop ends instead of swallowing it."""
    try:
        await run
    except asyncio.CancelledError:
        waiting = asyncio.current_task()
        if exiting or (waiting is not None and waiting.cancelling()):
            raise


class SessionCore:
    """One session's mailbox and work loop, in whichever process hosts it."""

    def __init__(self, session_id: uuid.UUID, placement: Placement) -> None:
        self.session_id = session_id
        self.placement = placement
        # One lease owner per incarnation: a restarted session never writes as its predecessor.
        self.owner = f"session:{session_id}:{uuid.uuid4().hex[:12]}"
        self.settings = get_settings()
        self._wake = asyncio.Event()
        self._current: asyncio.Task[None] | None = None
        self._current_turn: uuid.UUID | None = None
        self._working = False  # inside _run_claimable: reading or running work
        self.exiting = False

    # -- what the host provides ----------------------------------------------------------------------

    async def _database(self) -> Database:
        raise NotImplementedError

    def _heartbeats(self) -> Heartbeats:
        """What renews the leases of the Runs this process executes."""
        raise NotImplementedError

    def _ensure_loop(self) -> None:
        """Make sure the work loop (``_main``) runs."""
        raise NotImplementedError

    def _exited(self) -> None:
        """The work loop decided to exit: release what this session holds in its host."""
        raise NotImplementedError

    # -- the mailbox -----------------------------------------------------------------------------------

    async def signal(self) -> bool:
        """A hint: there may be work, a cancellation, or a stop. Re-read the facts.

        False means this session is on its way out: the caller activates it anew.
        """
        if self.exiting:
            return False
        self._ensure_loop()
        self._wake.set()
        await self._cancel_if_requested()
        return True

    def status(self) -> dict[str, str | int | None]:
        return {"owner": self.owner, "pid": os.getpid(),
                "turn_id": str(self._current_turn) if self._current_turn else None}

    async def passivate_if_idle(self, owner: str) -> bool:
        """The directory needs room: exit now unless there is work. True if this session exits."""
        if owner != self.owner:
            self._report()  # the directory knew a previous incarnation: tell it about this one
            return False
        if self._busy():
            return False
        db = await self._database()
        async with db.tx() as conn:
            work = await run_repo.has_claimable_run(conn, self.session_id)
        if work or self._busy():
            if work:
                self._wake.set()
            return False
        self._exit("evicted under max_live_sessions")
        return True

    def _busy(self) -> bool:
        """Exiting, working, or woken for work: not to be evicted now."""
        return self.exiting or self._working or self._wake.is_set()

    def leave_between_runs(self, why: str) -> None:
        """Exit now unless a Run is being read or run (its host moves, actors/hosting.py, and a Run
        in progress is handed back at its next model boundary): the work left is durable and is
        done where the session is made next."""
        if not self.exiting and not self._working:
            self._exit(why)

    def _may_go_on(self) -> bool:
        """Whether this incarnation may begin a Run, or a Run's next model step: not in a host that
        moves (actors/hosting.py), which hands the work to the session's next incarnation."""
        return True

    def _report(self) -> None:
        if self.exiting:  # gone() is sent: a late report must not list this incarnation again
            return
        directory.report(str(self.session_id), self.owner, this_actor(), busy=self._current is not None)

    async def _cancel_if_requested(self) -> None:
        if self._current is None or self._current.done() or self._current_turn is None:
            return
        db = await self._database()
        async with db.tx() as conn:
            status = await turns.turn_status(conn, self._current_turn)
        if status == TurnStatus.CANCELLING:
            self._current.cancel()

    # -- the work loop ---------------------------------------------------------------------------------

    async def _main(self) -> None:
        self._report()  # sent a little later, with other reports (directory.REPORT_DELAY_SECONDS)
        while not self.exiting:
            self._wake.clear()
            if await self._work():
                self._report()  # idle again: the most recently used
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.actor_idle_seconds)
            except TimeoutError:
                # Idle for actor_idle_seconds: a last look for work, then exit. No await
                # between the last look and _exit, so no signal is accepted and then lost.
                if self._wake.is_set():
                    continue
                if await self._work():
                    self._report()
                elif not self._wake.is_set():
                    self._exit("idle")

    async def _work(self) -> bool:
        """Whether a Run was run. A database that failed meanwhile (restarted: every pooled connection
        fails once) is logged and the loop goes on: it would otherwise end with this process left
        alive, never idle, until a hint. The Runs are durable; a granted one nobody took is the
        sweeper's to activate again."""
        self._working = True
        try:
            return await self._run_claimable()
        except Exception:
            log.exception("session %s could not look for work; it looks again when woken or idle", self.session_id)
            return False
        finally:
            self._working = False

    async def _acquire(self, conn: Connection) -> run_repo.AcquiredRun | None:
        """Take the lease of the oldest Run granted to this session and owned by nobody."""
        return await run_repo.acquire_next_run(conn, self.session_id, self.owner, self.settings.lease_seconds)

    async def _begin_next(self, db: Database) -> RunExecutor | None:
        """Acquire the next Run and begin it in the same transaction (one round of commits less
        on every activation). If beginning fails, the Run is acquired alone and begins in its
        executor, whose failure handling (lease expiry, recovery, give up after 5) applies."""
        try:
            async with db.tx() as conn:
                acquired = await self._acquire(conn)
                if acquired is None:
                    return None
                executor = self._executor(db, acquired)
                await executor.begin(conn, acquired)
                return executor
        except Exception:
            log.exception("beginning a run of session %s failed; acquiring it alone", self.session_id)
        async with db.tx() as conn:
            acquired = await self._acquire(conn)
        return self._executor(db, acquired) if acquired is not None else None

    def _executor(self, db: Database, acquired: run_repo.AcquiredRun) -> RunExecutor:
        return RunExecutor(db, self.settings, self.placement, acquired.run, heartbeats=self._heartbeats(),
                           go_on=self._may_go_on)

    async def _run_claimable(self) -> bool:
        db = await self._database()
        ran = False
        while self._may_go_on() and (executor := await self._begin_next(db)) is not None:
            ran = True
            run = executor.run
            self._current_turn = run.turn_id
            self._current = asyncio.create_task(executor.execute())
            self._report()  # busy
            try:
                await wait_for_run(self._current, exiting=self.exiting)
            except Exception:
                log.exception("run %s crashed; its lease will expire and it will be resumed", run.run_id)
            finally:
                self._current = None
                self._current_turn = None
        return ran

    def _exit(self, why: str) -> None:
        """Passivate. No await from the last check to here: from now on every signal is refused
        (its sender activates the session anew), so none is accepted and then lost."""
        log.info("session %s %s: passivating", self.session_id, why)
        self.exiting = True
        self._wake.set()  # a parked _main wakes up and returns
        directory.gone(str(self.session_id), self.owner)
        self._exited()
