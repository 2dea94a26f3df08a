"""The actors that run sessions and tree supervisors, for both shapes of actors/placement.py, and
this process's placement (:func:`current`).

They sit above everything they run: a session's Run activates other sessions and a supervisor
activates the sessions it grants, both through the placement that this module builds, hands
the actors' classes to, and gives every session and supervisor it starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

import ray

from actors import directory
from actors.heartbeats import Heartbeats
from actors.naming import session_actor_name
from actors.placement import Placement, ShapeActors, choose
from actors.session_actor import SessionCore, this_actor
from actors.tree_supervisor import SupervisorCore
from persistence import runs as run_repo
from persistence.db import Database, LazyDatabase
from persistence.settings import Settings, get_settings

log = logging.getLogger(__name__)

# A hosted session's dashboard task (a Ray call) starts this long after its loop does: during
# its first model call rather than between its hint and that call.
ANNOUNCE_DELAY_SECONDS = 0.05
# Connections a session host keeps open while idle: its supervisors' sweeps and a first session.
_HOST_POOL_MIN = 2
# A moving host looks this often for sessions whose Run has ended, to passivate them.
_DRAIN_POLL_SECONDS = 0.2
# How long a move request waits for the drain to end (an idle host's ends at once).
_MOVE_WAIT_SECONDS = 1.0
# A drain that gave up (settings.host_drain_seconds) is tried again this many times as long later.
_DRAIN_AGAIN_FACTOR = 10


async def _close_and_exit(what: str, *pools: LazyDatabase) -> None:
    """The end of a passivated actor (a dedicated one, or a host that moves): its pools close, and
    the actor exits for good (a later hint creates a new one)."""
    for db in pools:
        try:
            await asyncio.wait_for(db.close(), timeout=5)
        except Exception:
            log.debug("closing a pool of %s failed", what, exc_info=True)
    ray.kill(this_actor(), no_restart=True)


# -- the dedicated shape: an actor per session, an actor per tree supervisor ---------------------------


class SessionActorImpl(SessionCore):
    """This process is the session's actor, ``session:<id>``."""

    def __init__(self, session_id: str) -> None:
        super().__init__(uuid.UUID(session_id), current())
        directory.worker_taken()  # the next actor activated on this node finds a process running
        self._db = LazyDatabase(max_size=2)
        # The process runs this session's Runs alone, one at a time: they beat through its pool.
        self._beats = Heartbeats(self._db.get, self.settings)
        self._loop_task: asyncio.Task[None] | None = None
        self._shutdown: asyncio.Task[None] | None = None

    async def _database(self) -> Database:
        return await self._db.get()

    def _heartbeats(self) -> Heartbeats:
        return self._beats

    async def status(self) -> dict[str, str | int | None]:  # type: ignore[override]
        return SessionCore.status(self)

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._main())

    def _exited(self) -> None:
        self._shutdown = asyncio.get_running_loop().create_task(
            _close_and_exit(f"session {self.session_id}", self._db))


class TreeSupervisorImpl(SupervisorCore):
    """This process is the tree's supervisor actor, ``tree:<tree_id>``."""

    def __init__(self, tree_id: str) -> None:
        super().__init__(uuid.UUID(tree_id), current())
        directory.worker_taken()
        self._db = LazyDatabase(max_size=2)

    async def _database(self) -> Database:
        return await self._db.get()

    async def _exited(self, db: Database) -> None:
        await _close_and_exit(f"tree {self.tree_id}", self._db)


# -- the hosted shape: sessions and supervisors inside a few long-lived hosts --------------------------


class _HostedSession(SessionCore):
    def __init__(self, session_id: uuid.UUID, host: SessionHostImpl) -> None:
        super().__init__(session_id, host.placement)
        self._host = host
        self.work_loop: asyncio.Task[None] | None = None

    async def _database(self) -> Database:
        return await self._host.database()

    def _heartbeats(self) -> Heartbeats:
        return self._host.heartbeats

    def _may_go_on(self) -> bool:
        return not self._host.moving

    def _ensure_loop(self) -> None:
        if self.work_loop is None:
            self.work_loop = asyncio.get_running_loop().create_task(self._host.run(self))

    def _exited(self) -> None:
        self._host.forget(self)


class _HostedSupervisor(SupervisorCore):
    """Lives in the host of the tree's root session and uses the host's pool."""

    def __init__(self, tree_id: uuid.UUID, host: SessionHostImpl) -> None:
        super().__init__(tree_id, host.placement)
        self._host = host

    async def _database(self) -> Database:
        return await self._host.database()

    async def _exited(self, db: Database) -> None:
        self._host.forget_supervisor(self)


class SessionHostImpl:
    """One process runs many sessions, each as a task named ``session:<id>``, and the supervisors
    of the trees whose root it hosts."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.settings = get_settings()
        self.placement = current()
        # A host serves many sessions at once, so it may hold more connections than other processes;
        # it opens them as its sessions need them (each is a PostgreSQL backend of ~10 MiB held
        # until it has been idle for the pool's max_idle), not all up front.
        self._db = LazyDatabase(max_size=max(4, 2 * self.settings.db_pool_max), min_size=_HOST_POOL_MIN)
        # Its Runs' leases are renewed on a connection of their own (actors/heartbeats.py).
        self._beats_db = LazyDatabase(max_size=1, carries_metrics=False)
        self.heartbeats = Heartbeats(self._beats_db.get, self.settings)
        self._sessions: dict[uuid.UUID, _HostedSession] = {}
        self._supervisors: dict[uuid.UUID, _HostedSupervisor] = {}
        self._draining: asyncio.Task[None] | None = None
        self._drain_again_at = 0.0
        self._leaving: asyncio.Task[None] | None = None

    @property
    def moving(self) -> bool:
        """Moving to another node: no Run begins here, no session or supervisor is made here."""
        return self._draining is not None

    async def database(self) -> Database:
        return await self._db.get()

    async def ready(self) -> int:
        await self.database()
        return os.getpid()

    async def signal(self, session_id: str) -> bool:
        if self._leaving:
            return False  # its sender makes the host anew, where it now belongs
        sid = uuid.UUID(session_id)
        session = self._sessions.get(sid)
        if session is None or session.exiting:
            if self.moving:
                # Not made here, and no use retrying now: the work waits in the database, and the
                # sweep hands it on once the host is made again where it now belongs. Its grants are
                # held as a Run handed back is: a drain may outlast a lease.
                db = await self.database()
                async with db.tx() as conn:
                    await run_repo.hold_unowned(conn, sid, self.settings.drain_hold_seconds)
                return True
            session = self._sessions[sid] = _HostedSession(sid, self)
        return await session.signal()

    async def status(self, session_id: str | None = None) -> dict[str, Any]:
        if session_id is None:
            # A drain that gave up is not begun again before drains_again_in (seconds) has passed.
            drains_again_in = max(0.0, self._drain_again_at - asyncio.get_running_loop().time())
            return {"pid": os.getpid(), "index": self.index, "sessions": len(self._sessions),
                    "trees": len(self._supervisors), "moving": self.moving, "drains_again_in": drains_again_in}
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
        this_actor().run_session.options(name=session_actor_name(session.session_id)).remote(
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
        if self._leaving:
            return None
        tid = uuid.UUID(tree_id)
        supervisor = self._supervisors.get(tid)
        if supervisor is None or supervisor.exiting:
            if self.moving:
                return []  # as for a session: nothing granted here now, the sweep pokes again later
            supervisor = self._supervisors[tid] = _HostedSupervisor(tid, self)
        return await supervisor.poke()

    def forget_supervisor(self, supervisor: _HostedSupervisor) -> None:
        if self._supervisors.get(supervisor.tree_id) is supervisor:
            del self._supervisors[supervisor.tree_id]

    async def move(self, node_id: str) -> bool:
        """Leave for ``node_id`` (where the placement now puts this host) without cutting a Run off:
        the host drains (no Run and no model step begins here and no session or supervisor is made
        here; a Run in progress is handed back at its next model boundary, each session passivates
        once it works no more, the supervisors, which go on granting meanwhile, once no session is
        left), then exits, and the next hint makes it on ``node_id``. The work left waits in the
        database meanwhile (the sweep hands it on, a handed-back Run to the session's next
        incarnation): a drain is bounded, since it holds up the host's other sessions
        (``host_drain_seconds``; only a single model step or tool call outlasts it). True once the
        host is leaving; False while it drains, or when it already is on ``node_id`` (a drain under
        way stops)."""
        if self._leaving:
            return True
        if ray.get_runtime_context().get_node_id() == node_id:
            if self._draining is not None:  # the nodes changed back
                self._draining.cancel()
                self._draining = None
            return False
        if self._draining is None:
            if asyncio.get_running_loop().time() < self._drain_again_at:
                return False
            log.info("session host %d drains to move to node %s", self.index, node_id)
            self._draining = asyncio.create_task(self._drain())
        await asyncio.wait([self._draining], timeout=_MOVE_WAIT_SECONDS)
        return self._leaving is not None

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        limit = self.settings.host_drain_seconds
        deadline = loop.time() + limit
        while True:
            for session in list(self._sessions.values()):
                session.leave_between_runs("passivated: its host moves")
            if not self._sessions:
                break
            if loop.time() > deadline:
                # The host's sessions that are not live wait while it drains: not for any Run's length.
                log.warning("session host %d stays on its node: a model step or tool call was still in progress "
                            "after %.0f s of draining; it tries again in %.0f s", self.index, limit,
                            _DRAIN_AGAIN_FACTOR * limit)
                self._drain_again_at = loop.time() + _DRAIN_AGAIN_FACTOR * limit
                self._draining = None  # a session that began no Run meanwhile is handed it by the sweep
                return
            await asyncio.sleep(_DRAIN_POLL_SECONDS)
        for supervisor in list(self._supervisors.values()):
            await supervisor.passivate_now()
        log.info("session host %d leaves its node", self.index)
        self.heartbeats.close()
        self._leaving = asyncio.create_task(_close_and_exit(f"session host {self.index}", self._db, self._beats_db))


SHAPE_ACTORS = ShapeActors(session=ray.remote(SessionActorImpl), supervisor=ray.remote(TreeSupervisorImpl),
                           host=ray.remote(SessionHostImpl))

_current: tuple[Settings, Placement] | None = None


def placement_for(settings: Settings) -> Placement:
    """A placement of the shape ``settings`` ask for, with its own handle caches."""
    return choose(settings, SHAPE_ACTORS)


def current() -> Placement:
    """This process's placement, chosen once from its settings."""
    global _current
    settings = get_settings()
    if _current is None or _current[0] is not settings:
        _current = (settings, placement_for(settings))
    return _current[1]
