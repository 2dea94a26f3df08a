"""Where sessions and tree supervisors live, and how to reach them: one interface, two shapes.

- **Dedicated** (setting ``session_hosts = 0``, the SPEC's shape): a Ray actor per active
  session, ``session:<id>``, and per active tree supervisor, ``tree:<id>``. Killing one kills
  exactly that session's Run (or that tree's grants); activating a session that has no actor
  starts a Ray worker process.
- **Hosted** (``session_hosts = N``): N long-lived host actors, ``canopy:sessions:<k>``, run
  the sessions (a session always goes to host ``id % N``, so it never runs in two hosts at
  once), each as a host task named ``session:<id>`` (what the dashboard shows), and each tree's
  supervisor runs in the host of its root session. Activating a session is a call into a
  running process; killing a host interrupts all its sessions' Runs, which are recovered by
  lease expiry exactly like a killed dedicated actor's.

Where on a Ray cluster they go follows the setting ``session_spread``. Canopy's actors ask for
no resources, and Ray hands the creation of such an actor to a random node's raylet, which then
applies the actor's strategy from its own view: Ray's default means a random node, a soft node
affinity is as good as ignored, and Ray's ``SPREAD`` from several raylets at once can stack
actors on one node (two hosts on one of three nodes, seen in tests/actors/test_cluster_placement.py).
So the node is chosen here, with a hard node affinity, where it matters:

- ``pack``: a dedicated actor goes to the node of the process that creates it, so a tree's
  members gather where it started; every host goes to the first live node (by node id), so
  every hosted session runs there.
- ``spread``: dedicated actors use Ray's ``SPREAD``; host ``k`` goes to the ``k``-th live node
  (mod their number), so N hosts cover min(N, nodes) nodes. When nodes join or leave, a host no
  longer on its ``k``-th node moves there (``follow_nodes``, asked by the sweeper): it drains
  (begins no Run and no model step, makes no session; a Run in progress is handed back at its next
  model boundary and goes on in the session's next incarnation, from its committed history; each
  session passivates once it works no more, then the supervisors), exits, and is made again there.
  No step is cut off; the work that arrives meanwhile waits in the database until the host is made
  again. A drain that one model step or tool call keeps going longer than ``host_drain_seconds``
  gives up (the host stays) and is tried again ten times as long later.

When a pinned actor's node is gone, Ray refuses to restart it elsewhere
(``ActorUnschedulableError``): the next hint treats it like a dead actor and creates it anew, on
a live node, from a process that is alive.

The shape is chosen once per process from the settings (:func:`choose`); every other module
asks its :class:`Placement` and never branches on the shape. The actors themselves are
defined above this module (actors/hosting.py) and handed to it, since what they run
(sessions, supervisors) activates sessions through a placement in turn.

Reaching a session or a supervisor is a hint (see actors/signals.py): handles are cached per
process (a lookup by name is a blocking round trip to Ray's GCS), a refused or failed call is
retried on a fresh handle (the actor was passivating or died: get-or-create makes a new
one), and pokes to one tree coalesce: while one is in flight, any number of further pokes
from this process become a single follow-up poke.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import dataclasses
import logging
import uuid
from collections.abc import Coroutine
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.naming import (
    NAMESPACE,
    SharedLookups,
    connected_context,
    host_actor_name,
    live_nodes,
    named_options,
    session_actor_name,
    tree_actor_name,
)
from persistence.settings import Settings

log = logging.getLogger(__name__)

_ATTEMPTS = 5
# A hint never blocks its sender for good: an actor that cannot start (an overloaded node)
# still gets the queued call when it does; meanwhile the sweep retries from the facts.
_HINT_TIMEOUT_SECONDS = 30.0
_HANDLE_CACHE_SIZE = 4096
# A call to an actor that is gone: it exited or was killed, or its pinned node is gone.
_GONE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError)
# Every active session a host runs is one long-running task of the host.
_HOST_CONCURRENCY = 100_000

# Background hint tasks, kept referenced until done.
_background: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run a hint in the background of the current event loop, keeping it referenced."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


@dataclasses.dataclass(frozen=True)
class ShapeActors:
    """The Ray actor classes the shapes place (``ray.remote`` classes, defined in actors/hosting.py):
    ``session(session_id: str)`` and ``supervisor(tree_id: str)`` for the dedicated shape,
    ``host(index: int)`` for the hosted one."""

    session: Any
    supervisor: Any
    host: Any


class _Handles:
    """Get-or-create handles to named actors, cached (LRU) per process, by a uuid or an index.

    A cached handle may point at an actor that has since exited (passivated, killed, its pinned
    node lost): the call then fails (``_GONE``) and the caller asks again with ``fresh``.
    """

    def __init__(self, create: Any) -> None:
        self._create = create
        self._cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._cluster: str | None = None
        self._lookups = SharedLookups()

    async def get(self, key: Any, *, fresh: bool = False) -> Any:
        """The cached handle, else one got or made by a shared lookup (:class:`SharedLookups`)."""
        handle = self._cached(key, fresh=fresh)
        if handle is None:
            cluster = self._cluster
            handle = await self._lookups.run((cluster, key), lambda: self._create(key))
            if cluster == self._cluster:  # not a handle of the Ray this process has left meanwhile
                self._keep(key, handle)
        return handle

    def get_blocking(self, key: Any) -> Any:
        """:meth:`get` for code with no event loop to hold up."""
        handle = self._cached(key, fresh=False)
        return handle if handle is not None else self._keep(key, self._create(key))

    def _cached(self, key: Any, *, fresh: bool) -> Any:
        context = connected_context()
        cluster = f"{context.gcs_address}/{context.get_job_id()}"
        if cluster != self._cluster:  # Ray was shut down and started again in this process
            self._cache.clear()
            self._cluster = cluster
        if fresh:
            self._cache.pop(key, None)
        handle = self._cache.get(key)
        if handle is not None:
            self._cache.move_to_end(key)
        return handle

    def _keep(self, key: Any, handle: Any) -> Any:
        self._cache[key] = handle
        while len(self._cache) > _HANDLE_CACHE_SIZE:
            self._cache.popitem(last=False)
        return handle

    def forget(self, key: Any, handle: Any) -> None:
        if self._cache.get(key) is handle:
            self._cache.pop(key, None)


@dataclasses.dataclass(frozen=True)
class _Target:
    """One call that reaches a session or a supervisor: on the actor cached under ``key``."""

    handles: _Handles
    key: Any
    method: str
    args: tuple[str, ...] = ()


class _InFlight:
    """A poke in flight from this process, and whether another is owed after it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.again = False


class Placement(abc.ABC):
    """Where this runtime's sessions and tree supervisors live, and how to reach them."""

    def __init__(self) -> None:
        self._poking: dict[uuid.UUID, _InFlight] = {}

    # -- what each shape defines -----------------------------------------------------------------------

    @abc.abstractmethod
    def _session_target(self, session_id: uuid.UUID) -> _Target:
        """The call that hints a session (``signal``: False means it is on its way out)."""

    @abc.abstractmethod
    def _supervisor_target(self, tree_id: uuid.UUID) -> _Target:
        """The call that pokes a tree's supervisor (``poke``: None means it is on its way out)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start what lives as long as the runtime (called by the sweeper when the runtime starts)."""

    async def follow_nodes(self) -> list[str]:
        """Move what this shape placed by the cluster's nodes to where their current list puts it
        (called by the sweeper now and then); the names of the actors moved."""
        return []  # a dedicated actor is placed when it is made, and lives only while its session works

    @abc.abstractmethod
    def actor_name(self, session_id: uuid.UUID) -> str:
        """The name of the actor that runs the session (and, for a root, its tree's supervisor in
        the hosted shape): what Ray's dashboard and the log lines of its process show."""

    @abc.abstractmethod
    def supervisor_actor_name(self, tree_id: uuid.UUID) -> str:
        """The name of the actor that runs the tree's supervisor."""

    def session_actor(self, session_id: uuid.UUID) -> Any:
        """The live actor that runs the session, for operators and tests (``status``, a kill);
        ValueError when there is none. A blocking call to Ray's GCS: from async code, in a thread."""
        return ray.get_actor(self.actor_name(session_id), namespace=NAMESPACE)

    def supervisor_actor(self, tree_id: uuid.UUID) -> Any:
        """The live actor that runs the tree's supervisor; ValueError when there is none."""
        return ray.get_actor(self.supervisor_actor_name(tree_id), namespace=NAMESPACE)

    @abc.abstractmethod
    async def session_status(self, session_id: uuid.UUID) -> dict[str, Any] | None:
        """The session's live incarnation (``owner``, ``pid``, ``turn_id``), None when it is not live."""

    # -- reaching ---------------------------------------------------------------------------------------

    async def activate(self, session_id: uuid.UUID) -> None:
        """Get or create the session and tell it to re-read its work (retrying one that is
        passivating or died between lookup and call)."""
        await self._hint(self._session_target(session_id), f"session {session_id}", refused=False)

    def poke_tree(self, tree_id: uuid.UUID) -> None:
        """Ask the tree's supervisor to grant free slots (fire and forget, coalesced)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here: a plain fire-and-forget call
            target = self._supervisor_target(tree_id)
            try:
                getattr(target.handles.get_blocking(target.key), target.method).remote(*target.args)
            except Exception:  # a hint: the sweep re-pokes trees with queued runs
                log.exception("could not poke tree %s", tree_id)
            return
        in_flight = self._poking.get(tree_id)
        if in_flight is not None and in_flight.loop is loop and not loop.is_closed():
            in_flight.again = True  # one more poke after the one in flight, which may predate our commit
            return
        in_flight = self._poking[tree_id] = _InFlight(loop)
        spawn(self._poke_until_current(tree_id, in_flight))

    async def _poke_until_current(self, tree_id: uuid.UUID, in_flight: _InFlight) -> None:
        try:
            while True:
                await self._hint(self._supervisor_target(tree_id), f"the supervisor of tree {tree_id}", refused=None)
                if not in_flight.again:
                    return
                in_flight.again = False
        finally:
            if self._poking.get(tree_id) is in_flight:
                del self._poking[tree_id]

    async def _hint(self, target: _Target, what: str, *, refused: object) -> None:
        """Call ``target`` until it accepts: an answer equal to ``refused`` (on its way out) or a
        dead actor is retried on a fresh handle. A hint never fails its sender: the sweep retries."""
        for attempt in range(_ATTEMPTS):
            handle = None
            try:
                handle = await target.handles.get(target.key, fresh=attempt > 0)
                call = getattr(handle, target.method).remote(*target.args)
                if await asyncio.wait_for(call, _HINT_TIMEOUT_SECONDS) != refused:
                    return
            except _GONE:  # passivated, killed or its node lost: create it anew
                pass
            except TimeoutError:
                log.warning("%s did not answer a hint in %.0f s; the sweep will retry", what, _HINT_TIMEOUT_SECONDS)
                return
            except Exception:
                log.exception("could not reach %s; the sweep will retry", what)
                return
            target.handles.forget(target.key, handle)
            if attempt:
                await asyncio.sleep(0.05 * attempt)
        log.warning("could not reach %s; the sweep will retry", what)


class Dedicated(Placement):
    """A Ray actor per active session and per active tree supervisor."""

    def __init__(self, actors: ShapeActors, spread: bool) -> None:
        super().__init__()
        where = _ray_spread if spread else _this_node
        self._sessions = _Handles(lambda session_id: actors.session.options(
            **named_options(session_actor_name(session_id), **where())).remote(str(session_id)))
        self._supervisors = _Handles(lambda tree_id: actors.supervisor.options(
            **named_options(tree_actor_name(tree_id), **where())).remote(str(tree_id)))

    def _session_target(self, session_id: uuid.UUID) -> _Target:
        return _Target(self._sessions, session_id, "signal")

    def _supervisor_target(self, tree_id: uuid.UUID) -> _Target:
        return _Target(self._supervisors, tree_id, "poke")

    async def start(self) -> None:
        """Nothing lives ahead of its session or tree."""

    def actor_name(self, session_id: uuid.UUID) -> str:
        return session_actor_name(session_id)

    def supervisor_actor_name(self, tree_id: uuid.UUID) -> str:
        return tree_actor_name(tree_id)

    async def session_status(self, session_id: uuid.UUID) -> dict[str, Any] | None:
        try:
            return await (await asyncio.to_thread(self.session_actor, session_id)).status.remote()
        except (ValueError, *_GONE):
            return None


class Hosted(Placement):
    """Sessions and tree supervisors inside ``hosts`` long-lived host actors."""

    def __init__(self, actors: ShapeActors, hosts: int, spread: bool) -> None:
        super().__init__()
        self.hosts = hosts
        self._spread = spread
        self._hosts = _Handles(lambda index: actors.host.options(
            **named_options(host_actor_name(index), max_concurrency=_HOST_CONCURRENCY,
                            **_nth_live_node(index if spread else 0))).remote(index))

    def host_index(self, key: uuid.UUID) -> int:
        """The host of a session, or of a tree's supervisor (keyed by its root session's id)."""
        return key.int % self.hosts

    def _session_target(self, session_id: uuid.UUID) -> _Target:
        return _Target(self._hosts, self.host_index(session_id), "signal", (str(session_id),))

    def _supervisor_target(self, tree_id: uuid.UUID) -> _Target:
        return _Target(self._hosts, self.host_index(tree_id), "poke_tree", (str(tree_id),))

    async def start(self) -> None:
        """Start the hosts (and open their connections) so that no activation waits for a process."""
        async def ready(index: int) -> None:
            await (await self._hosts.get(index)).ready.remote()

        await asyncio.gather(*(ready(index) for index in range(self.hosts)))

    async def follow_nodes(self) -> list[str]:
        """Spread: a host that is not on the node its index now names (nodes joined or left) moves
        there (``SessionHostImpl.move``: it drains, then exits) and is made again on that node. Pack
        keeps the hosts where they are."""
        if not self._spread:
            return []
        nodes = await asyncio.to_thread(live_nodes)
        moved = []
        for index in range(self.hosts):
            try:
                if await self._move(index, nodes[index % len(nodes)]):
                    moved.append(host_actor_name(index))
            except Exception:
                log.exception("moving session host %d failed; the next round asks again", index)
        return moved

    async def _move(self, index: int, node_id: str) -> bool:
        name = host_actor_name(index)
        try:
            host = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
        except ValueError:
            return False  # not running: it is made where it belongs when next needed
        try:
            if not await asyncio.wait_for(host.move.remote(node_id), _HINT_TIMEOUT_SECONDS):
                return False  # there already, or draining: the next round asks again
        except ray.exceptions.ActorDiedError:
            pass  # a host that drained at once may exit before its reply leaves: it left all the same
        if not await _until_gone(name):
            return False  # still there (an outage of its node, not its exit): the next round asks again
        # Made now, so that no activation waits for its start (a hint would make it all the same).
        host = await self._hosts.get(index, fresh=True)
        await asyncio.wait_for(host.ready.remote(), _HINT_TIMEOUT_SECONDS)
        return True

    def actor_name(self, session_id: uuid.UUID) -> str:
        return host_actor_name(self.host_index(session_id))

    def supervisor_actor_name(self, tree_id: uuid.UUID) -> str:
        return host_actor_name(self.host_index(tree_id))

    async def session_status(self, session_id: uuid.UUID) -> dict[str, Any] | None:
        try:
            status = await (await asyncio.to_thread(self.session_actor, session_id)).status.remote(str(session_id))
        except (ValueError, *_GONE):
            return None
        return status if status["owner"] is not None else None


def _this_node() -> dict[str, Any]:
    """Ray options that put a dedicated actor on the node of the process creating it (``pack``)."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                  soft=False)}


def _ray_spread() -> dict[str, Any]:
    return {"scheduling_strategy": "SPREAD"}


def _nth_live_node(index: int) -> dict[str, Any]:
    """Ray options that put a host on the ``index``-th live node by node id, mod their number."""
    nodes = live_nodes()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[index % len(nodes)], soft=False)}


async def _until_gone(name: str, timeout: float = _HINT_TIMEOUT_SECONDS) -> bool:
    """Whether Ray, within ``timeout``, no longer knows a live actor of that name (an exiting actor
    still holds it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
        except ValueError:
            return True
        await asyncio.sleep(0.1)
    return False


def choose(settings: Settings, actors: ShapeActors) -> Placement:
    """The placement the settings ask for (``session_hosts``, ``session_spread``)."""
    spread = settings.session_spread == "spread"
    if settings.session_hosts:
        return Hosted(actors, settings.session_hosts, spread)
    return Dedicated(actors, spread)
