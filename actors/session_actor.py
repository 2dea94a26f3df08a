"""SessionActor: one per *active* session, named ``session:<session_id>``.

A session keeps no state that matters: its mailbox holds hints, and on every hint it
re-reads the durable facts (runs granted to this session and not yet owned). An idle
session passivates after ``actor_idle_seconds``, or earlier when its node's directory
needs room under ``max_live_sessions`` (least recently used first); it is re-activated
on demand, and rebuilding it is the same code path as after a crash.

Where a session lives (setting ``CANOPY_SESSION_HOSTS``):

- ``0`` (default, the SPEC's shape): a dedicated Ray actor per active session, named
  ``session:<id>``. Killing it kills exactly that session's Run.
- ``N > 0``: N long-lived host actors (``canopy:sessions:<k>``, a session goes to host
  ``hash(id) % N``) each run many sessions, and the supervisors of the trees whose root
  they host. Activating a session is then a call into a running process instead of a
  new worker process (~0.4–0.9 s of CPU each on a small machine). Each active session
  runs as a host task named ``session:<id>``, which is what the dashboard shows; killing
  a host interrupts all its sessions' Runs, which are recovered by lease expiry exactly
  like a killed dedicated actor's.

Both shapes run the same ``SessionCore``: the same mailbox, lease owner per incarnation,
passivation and reports to the directory. Sessions stay small: no model client (the
ModelGateway is the only importer of litellm), and cached lookups of the gateway and the
directory.
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
from actors.local_channel import ChannelServer
from actors.naming import GATEWAY_NAME, NAMESPACE, session_actor_name
from actors.tree_supervisor import HostedSupervisor
from persistence import runs as run_repo
from persistence.db import Connection, Database, LazyDatabase
from persistence.settings import get_settings

log = logging.getLogger(__name__)

_gateway: Any = None
# A hosted session's dashboard task (a Ray call) starts this long after its loop does: during
# its first model call rather than between its hint and that call.
ANNOUNCE_DELAY_SECONDS = 0.05


@functools.cache
def _this_actor() -> Any:
    """The handle of the actor this process runs (one for the process's life; building it is a
    lookup in Ray's runtime context, too slow for every report)."""
    return ray.get_runtime_context().current_actor


def _gateway_handle() -> Any:
    global _gateway
    if _gateway is None:
        _gateway = ray.get_actor(GATEWAY_NAME, namespace=NAMESPACE)
    return _gateway


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

    def __init__(self, session_id: uuid.UUID) -> None:
        self.session_id = session_id
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
        return self.exiting or self._working or self._wake.is_set()

    def _report(self) -> None:
        if self.exiting:  # gone() is sent: a late report must not list this incarnation again
            return
        directory.report(str(self.session_id), self.owner, _this_actor(), busy=self._current is not None)

    async def _cancel_if_requested(self) -> None:
        if self._current is None or self._current.done() or self._current_turn is None:
            return
        db = await self._database()
        async with db.tx() as conn:
            cur = await conn.execute("SELECT status FROM turns WHERE turn_id = %s", (self._current_turn,))
            turn = await cur.fetchone()
        if turn is not None and turn["status"] == "cancelling":
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
        self._working = True
        try:
            return await self._run_claimable()
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
                executor = RunExecutor(db, self.settings, _gateway_handle(), acquired.run)
                await executor.begin(conn, acquired)
                return executor
        except Exception:
            log.exception("beginning a run of session %s failed; acquiring it alone", self.session_id)
        async with db.tx() as conn:
            acquired = await self._acquire(conn)
        return RunExecutor(db, self.settings, _gateway_handle(), acquired.run) if acquired is not None else None

    async def _run_claimable(self) -> bool:
        db = await self._database()
        ran = False
        while (executor := await self._begin_next(db)) is not None:
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


class SessionActorImpl(SessionCore):
    """The dedicated shape: this process is the session's actor, ``session:<id>``."""

    def __init__(self, session_id: str) -> None:
        super().__init__(uuid.UUID(session_id))
        self._db = LazyDatabase(max_size=2)
        self._loop_task: asyncio.Task[None] | None = None
        self._shutdown: asyncio.Task[None] | None = None

    async def _database(self) -> Database:
        return await self._db.get()

    async def status(self) -> dict[str, str | int | None]:  # type: ignore[override]
        return SessionCore.status(self)

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._main())

    def _exited(self) -> None:
        self._shutdown = asyncio.get_running_loop().create_task(self._close_and_exit())

    async def _close_and_exit(self) -> None:
        try:
            await asyncio.wait_for(self._db.close(), timeout=5)
        except Exception:
            log.debug("closing the pool of session %s failed", self.session_id, exc_info=True)
        ray.kill(_this_actor(), no_restart=True)


class _HostedSession(SessionCore):
    def __init__(self, session_id: uuid.UUID, host: SessionHostImpl) -> None:
        super().__init__(session_id)
        self._host = host
        self.work_loop: asyncio.Task[None] | None = None

    async def _database(self) -> Database:
        return await self._host.database()

    def _ensure_loop(self) -> None:
        if self.work_loop is None:
            self.work_loop = asyncio.get_running_loop().create_task(self._host.run(self))

    def _exited(self) -> None:
        self._host.forget(self)


class SessionHostImpl:
    """The hosted shape: one process runs many sessions, each as a task named ``session:<id>``."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.settings = get_settings()
        # A host lives as long as the runtime and serves many sessions at once: its connections
        # are opened up front, not while the first wide tree waits.
        size = max(4, 2 * self.settings.db_pool_max)
        self._db = LazyDatabase(max_size=size, min_size=size)
        self._sessions: dict[uuid.UUID, _HostedSession] = {}
        self._supervisors: dict[uuid.UUID, HostedSupervisor] = {}
        # Activation hints from this node arrive here without a Ray call (see local_channel).
        self._channel = ChannelServer({"signal": self.signal})

    async def database(self) -> Database:
        return await self._db.get()

    async def ready(self) -> int:
        await self.database()
        return os.getpid()

    def _session(self, session_id: str) -> _HostedSession:
        sid = uuid.UUID(session_id)
        session = self._sessions.get(sid)
        if session is None or session.exiting:
            session = self._sessions[sid] = _HostedSession(sid, self)
        return session

    async def signal(self, session_id: str) -> bool:
        return await self._session(session_id).signal()

    async def channel_address(self) -> dict[str, str]:
        return await self._channel.address()

    async def status(self, session_id: str | None = None) -> dict[str, Any]:
        if session_id is None:
            return {"pid": os.getpid(), "index": self.index, "sessions": len(self._sessions),
                    "trees": len(self._supervisors)}
        session = self._sessions.get(uuid.UUID(session_id))
        return session.status() if session is not None else {"pid": os.getpid(), "owner": None, "turn_id": None}

    async def passivate_if_idle(self, owner: str) -> bool:
        """The directory's eviction: ``owner`` names the session (``session:<id>:<incarnation>``)."""
        session = self._sessions.get(uuid.UUID(owner.split(":")[1]))
        if session is None or session.owner != owner:
            return True  # that incarnation is gone already
        return await session.passivate_if_idle(owner)

    async def run(self, session: _HostedSession) -> None:
        """A session's work loop, started at once by its first hint. The dashboard sees it as
        this actor's task ``session:<id>``, which lasts as long as the loop; the loop does not
        wait for that task to start (a round trip through Ray on every activation)."""
        asyncio.get_running_loop().call_later(ANNOUNCE_DELAY_SECONDS, self._show, session)
        try:
            await session._main()
        except Exception:
            log.exception("session %s stopped; the next hint starts it again", session.session_id)
            if not session.exiting:
                session._exit("crashed")

    def _show(self, session: _HostedSession) -> None:
        _this_actor().run_session.options(name=session_actor_name(session.session_id)).remote(
            str(session.session_id), session.owner)

    async def run_session(self, session_id: str, owner: str) -> None:
        """The dashboard's view of a live session: ends when its work loop does."""
        session = self._sessions.get(uuid.UUID(session_id))
        if session is None or session.owner != owner or session.work_loop is None:
            return
        await asyncio.wait([session.work_loop])  # never cancels the loop, never raises its error

    def forget(self, session: _HostedSession) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]

    async def poke_tree(self, tree_id: str) -> list[str] | None:
        """A poke for the tree's supervisor, which lives here (created on demand, like a session)."""
        tid = uuid.UUID(tree_id)
        supervisor = self._supervisors.get(tid)
        if supervisor is None or supervisor.exiting:
            supervisor = self._supervisors[tid] = HostedSupervisor(tid, self)
        return await supervisor.poke()

    def forget_supervisor(self, supervisor: HostedSupervisor) -> None:
        if self._supervisors.get(supervisor.tree_id) is supervisor:
            del self._supervisors[supervisor.tree_id]


SessionActor = ray.remote(SessionActorImpl)
SessionHost = ray.remote(SessionHostImpl)
