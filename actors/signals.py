"""After-commit hints: activate a session, poke a tree's supervisor, wake waiters.

Every hint is sent only after the facts it points at are committed, and losing one
only delays work: the sweeper re-derives the same hints from the durable facts.

Hints are on the critical path of every grant, so they are cheap: actor handles are
cached per process (a lookup by name is a blocking round trip to Ray's GCS), a hint to a
shared session host on this node goes over the host's socket (see local_channel), a poke is
sent at once and awaited in the background (a dead supervisor is re-created at once,
not at the next sweep), and pokes to one tree coalesce: while one is in flight, any
number of further pokes from this process become a single follow-up poke.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import uuid
from collections.abc import Coroutine, Iterable
from typing import Any

import ray

from actors import local_channel
from actors.naming import (
    host_actor_name,
    host_index,
    named_options,
    session_actor_name,
    session_hosts_setting,
    tree_actor_name,
)
from persistence import runs as run_repo
from persistence import waits
from persistence.db import Connection, Database
from persistence.settings import get_settings

log = logging.getLogger(__name__)
_ACTIVATION_ATTEMPTS = 5
# A hint never blocks its sender for good: an actor that cannot start (an overloaded node)
# still gets the queued call when it does; meanwhile the sweep retries from the facts.
_HINT_TIMEOUT_SECONDS = 30.0
_HANDLE_CACHE_SIZE = 4096


class _Handles:
    """Get-or-create handles to named actors, cached (LRU) per process, by a uuid or an index.

    A cached handle may point at an actor that has since exited (passivated, killed):
    the call then fails with ``RayActorError`` and the caller asks again with ``fresh``.
    """

    def __init__(self, create: Any) -> None:
        self._create = create
        self._cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._cluster: str | None = None

    def get(self, key: Any, *, fresh: bool = False) -> Any:
        cluster = _cluster_key()
        if cluster != self._cluster:  # Ray was shut down and started again in this process
            self._cache.clear()
            self._cluster = cluster
        if fresh:
            self._cache.pop(key, None)
        handle = self._cache.get(key)
        if handle is None:
            handle = self._create(key)
            self._cache[key] = handle
            while len(self._cache) > _HANDLE_CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return handle

    def forget(self, key: Any, handle: Any | None = None) -> None:
        if handle is None or self._cache.get(key) is handle:
            self._cache.pop(key, None)


def _cluster_key() -> str:
    context = ray.get_runtime_context()
    return f"{context.gcs_address}/{context.get_job_id()}"


def _new_session_actor(session_id: uuid.UUID) -> Any:
    from actors.session_actor import SessionActor

    return SessionActor.options(**named_options(session_actor_name(session_id))).remote(str(session_id))


def _new_session_host(index: int) -> Any:
    from actors.session_actor import SessionHost

    # Every active session it hosts is one long-running task of the host.
    return SessionHost.options(**named_options(host_actor_name(index), max_concurrency=100_000)).remote(index)


def _new_supervisor(tree_id: uuid.UUID) -> Any:
    from actors.tree_supervisor import TreeSupervisor

    return TreeSupervisor.options(**named_options(tree_actor_name(tree_id))).remote(str(tree_id))


_sessions = _Handles(_new_session_actor)
_hosts = _Handles(_new_session_host)
_supervisors = _Handles(_new_supervisor)
# Background hint tasks, kept referenced until done.
_background: set[asyncio.Task[Any]] = set()


class _InFlight:
    """A poke in flight from this process, and whether another is owed after it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.again = False


_poking: dict[uuid.UUID, _InFlight] = {}


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run a hint in the background of the current event loop, keeping it referenced."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def activate_session(session_id: uuid.UUID) -> None:
    """Get or create the session's actor and tell it to re-read its work.

    A passivating actor may die between lookup and call, or refuse the signal because
    it is on its way out; then it is created anew. With shared session hosts
    (``CANOPY_SESSION_HOSTS``) the session is activated inside its host instead.
    """
    hosts = session_hosts_setting()
    for attempt in range(_ACTIVATION_ATTEMPTS):
        if hosts:
            cache, key = _hosts, host_index(session_id, hosts)
            handle = cache.get(key, fresh=attempt > 0)
            call = local_channel.call(handle, host_actor_name(key), "signal", session_id=str(session_id))
        else:
            cache, key = _sessions, session_id
            handle = cache.get(key, fresh=attempt > 0)
            call = handle.signal.remote()
        try:
            if await asyncio.wait_for(call, _HINT_TIMEOUT_SECONDS) is not False:
                return
        except (ray.exceptions.RayActorError, local_channel.ChannelClosed):
            pass
        except TimeoutError:
            log.warning("session %s did not answer its activation in %.0f s; the sweep will retry",
                        session_id, _HINT_TIMEOUT_SECONDS)
            return
        cache.forget(key, handle)
        if attempt:
            await asyncio.sleep(0.05 * attempt)
    log.warning("could not activate session %s; the sweep will retry", session_id)


async def start_session_hosts() -> None:
    """Start the shared session hosts, if configured, so no activation waits for a process."""
    hosts = session_hosts_setting()
    await asyncio.gather(*(_hosts.get(index).ready.remote() for index in range(hosts)))


def poke_tree(tree_id: uuid.UUID) -> None:
    """Ask the tree's supervisor to grant free slots (fire and forget, coalesced)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no event loop here: a plain fire-and-forget call
        try:
            _supervisor_poke(tree_id, fresh=False)
        except Exception:  # a hint: the sweep re-pokes trees with queued runs
            log.exception("could not poke tree %s", tree_id)
        return
    loop = asyncio.get_running_loop()
    in_flight = _poking.get(tree_id)
    if in_flight is not None and in_flight.loop is loop and not loop.is_closed():
        in_flight.again = True  # one more poke after the one in flight, which may predate our commit
        return
    in_flight = _poking[tree_id] = _InFlight(loop)
    spawn(_poke_until_current(tree_id, in_flight))


async def _poke_until_current(tree_id: uuid.UUID, in_flight: _InFlight) -> None:
    try:
        while True:
            await _poke(tree_id)
            if not in_flight.again:
                return
            in_flight.again = False
    finally:
        if _poking.get(tree_id) is in_flight:
            del _poking[tree_id]


async def _poke(tree_id: uuid.UUID) -> None:
    for attempt in range(_ACTIVATION_ATTEMPTS):
        try:
            if await asyncio.wait_for(_supervisor_poke(tree_id, fresh=attempt > 0), _HINT_TIMEOUT_SECONDS) is not None:
                return
        except ray.exceptions.RayActorError:  # passivated or killed: create it anew
            pass
        except TimeoutError:
            log.warning("the supervisor of tree %s did not answer a poke in %.0f s; the sweep will retry",
                        tree_id, _HINT_TIMEOUT_SECONDS)
            return
        except Exception:  # a hint: the sweep re-pokes trees with queued runs
            log.exception("could not poke tree %s", tree_id)
            return
        _forget_supervisor(tree_id)  # it is exiting or gone
        if attempt:
            await asyncio.sleep(0.05 * attempt)
    log.warning("could not poke tree %s; the sweep will retry", tree_id)


def _supervisor_poke(tree_id: uuid.UUID, *, fresh: bool) -> Any:
    """Call the tree supervisor's poke: its own actor, or in the host of the tree's root session."""
    hosts = session_hosts_setting()
    if hosts:
        return _hosts.get(host_index(tree_id, hosts), fresh=fresh).poke_tree.remote(str(tree_id))
    return _supervisors.get(tree_id, fresh=fresh).poke.remote()


def _forget_supervisor(tree_id: uuid.UUID) -> None:
    hosts = session_hosts_setting()
    if not hosts:  # a host outlives its supervisors: its handle stays good
        _supervisors.forget(tree_id)


def poke_trees(tree_ids: Iterable[uuid.UUID]) -> None:
    for tree_id in dict.fromkeys(tree_ids):
        poke_tree(tree_id)


async def resume_wait(db: Database, wait_id: uuid.UUID) -> None:
    """Resume one wait if it is due (idempotent): its resume Run is queued and, when a slot is
    free, granted in the same commit."""
    hints = NO_HINTS
    async with db.tx() as conn:
        resumed = await waits.try_resume(conn, wait_id)
        if resumed:
            hints = await change_hints(conn, [], hand_off_tree=resumed["tree_id"])
    await send_hints(db, hints)


async def _resume_each(db: Database, wait_ids: list[uuid.UUID]) -> None:
    for wait_id in wait_ids:
        try:
            await resume_wait(db, wait_id)
        except Exception:  # isolated per wait; the sweep retries it
            log.exception("resuming wait %s failed", wait_id)


@dataclasses.dataclass(frozen=True)
class ChangeHints:
    """What to tell after a commit that touched some sessions: their trees (a slot may be free,
    an input queued), the open waits watching them (their waiters may now be due), and the
    sessions whose Runs the commit itself granted a slot (see ``change_hints``)."""

    tree_ids: list[uuid.UUID]
    wait_ids: list[uuid.UUID]
    granted_sessions: list[uuid.UUID] = dataclasses.field(default_factory=list)


NO_HINTS = ChangeHints([], [])


async def change_hints(conn: Connection, session_ids: Iterable[uuid.UUID], *,
                       hand_off_tree: uuid.UUID | None = None) -> ChangeHints:
    """Read the hints for a change inside its own transaction (one round trip less after it).

    With ``hand_off_tree`` (the commit freed a slot of that tree, or queued a Run in it) the
    tree's free slots are granted here too, if its lock is free: the granted sessions are
    activated straight after the commit, and the supervisor need not be asked.
    """
    ids = list(dict.fromkeys(session_ids))
    tree_ids: list[uuid.UUID] = []
    wait_ids: list[uuid.UUID] = []
    if ids:
        tree_ids, wait_ids = await waits.change_targets(conn, ids)
    if hand_off_tree is None:
        return ChangeHints(tree_ids, wait_ids)
    granted = await run_repo.hand_off_slots(conn, hand_off_tree, get_settings().lease_seconds)
    if granted is None:  # the tree is locked by another transaction: its supervisor grants after it
        return ChangeHints(list(dict.fromkeys([*tree_ids, hand_off_tree])), wait_ids)
    return ChangeHints([t for t in tree_ids if t != hand_off_tree], wait_ids,
                       [row["session_id"] for row in granted])


async def send_hints(db: Database, hints: ChangeHints) -> None:
    """After the commit: sessions granted by the commit are activated and the trees poked first
    (a slot the commit freed is granted while the waiters are evaluated), then the due waits
    are resumed."""
    for session_id in hints.granted_sessions:
        spawn(activate_session(session_id))
    poke_trees(hints.tree_ids)
    await _resume_each(db, hints.wait_ids)


async def after_change(db: Database, session_ids: Iterable[uuid.UUID]) -> None:
    """The usual hint after a commit touching these sessions: grant slots, wake waiters."""
    async with db.tx() as conn:
        hints = await change_hints(conn, session_ids)
    await send_hints(db, hints)
