"""Actor names and options: the Ray dashboard shows ``session:…``, ``tree:…`` and ``canopy:…``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Callable
from typing import Any

import ray

NAMESPACE = "canopy"
SWEEPER_NAME = "canopy:sweeper"


def session_actor_name(session_id: uuid.UUID | str) -> str:
    return f"session:{session_id}"


def directory_actor_name(node_id: str) -> str:
    """The live-session directory of one Ray node (see actors/directory.py)."""
    return f"canopy:directory:{node_id}"


def gateway_actor_name(node_id: str) -> str:
    """The model gateway of one Ray node (see actors/gateways.py)."""
    return f"canopy:gateway:{node_id}"


def sandbox_host_name(node_id: str) -> str:
    """The sandbox host of one Ray node (see actors/sandbox_hosts.py)."""
    return f"canopy:sandbox:{node_id}"


def tree_actor_name(tree_id: uuid.UUID | str) -> str:
    return f"tree:{tree_id}"


def named_options(name: str, **extra: Any) -> dict[str, Any]:
    """Detached (no fate-sharing with whoever created it), restartable, zero-CPU, get-or-create."""
    return {"name": name, "namespace": NAMESPACE, "get_if_exists": True, "lifetime": "detached",
            "max_restarts": -1, "num_cpus": 0, **extra}


def node_local_options(name: str, node_id: str, **extra: Any) -> dict[str, Any]:
    """``named_options`` for an actor of one node: pinned there (never moved to another node when
    it restarts), so every process of the node finds its own under the node's name."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return named_options(name, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), **extra)


def node_table() -> dict[str, tuple[bool, str]]:
    """Every node this life of the cluster knows, alive or dead: ``node id -> (alive, address)`` (a
    blocking call to Ray's GCS: from async code, in a thread). A node of an earlier life (Ray started
    again) is not in it."""
    return {node["NodeID"]: (bool(node["Alive"]), str(node["NodeManagerAddress"])) for node in ray.nodes()}


def live_nodes() -> list[str]:
    """The cluster's live nodes by node id, for options that name a node (a blocking call to Ray's
    GCS: from async code, in a thread)."""
    return sorted(node_id for node_id, (alive, _) in node_table().items() if alive)


def connected_context() -> Any:
    """Ray's runtime context of this process, which must be connected: asked in a process that is
    not (a driver after ray.shutdown, with a hint or a report still under way), Ray would start a
    cluster of its own there. RuntimeError instead."""
    if not ray.is_initialized():
        raise RuntimeError("Ray is not connected in this process")
    return ray.get_runtime_context()


# Lookups of named actors run here, apart from the default executor's threads (which the health
# check and the node table's reads use): a GCS that has slowed down holds these and nothing else.
_LOOKUPS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="canopy-actor-lookup")


class SharedLookups:
    """Lookups of named actors (calls to Ray's GCS, which one under load or restarting makes last
    seconds) made in a thread, so that the caller's loop (a session host's: every session's lease
    renewals and model calls) runs on; one per key at a time, awaited by every caller that asks for
    that key meanwhile (a gateway's death sends every call of a host to look it up at once). A
    caller cancelled leaves the lookup to the others."""

    def __init__(self) -> None:
        self._running: dict[Any, concurrent.futures.Future[Any]] = {}

    async def run(self, key: Any, lookup: Callable[[], Any]) -> Any:
        running = self._running.get(key)
        if running is None:
            running = self._running[key] = _LOOKUPS.submit(lookup)
            running.add_done_callback(lambda done: self._ended(key, done))
        return await asyncio.shield(asyncio.wrap_future(running))

    def _ended(self, key: Any, done: concurrent.futures.Future[Any]) -> None:
        if self._running.get(key) is done:
            del self._running[key]


class NodeLocal:
    """This process's handle to its node's instance of a per-node actor, made by ``create(node_id)``
    (a get-or-create with ``node_local_options``) on first use and kept: a handle stays valid
    while the actor lives. Keyed by the cluster too, for a driver that joins another one."""

    def __init__(self, create: Callable[[str], Any]) -> None:
        self._create = create
        self._handle: Any = None
        self._key: str | None = None
        self._lookups = SharedLookups()

    async def handle(self) -> Any:
        """The kept handle, else one got or made by a shared lookup (:class:`SharedLookups`)."""
        node_id, key = self._where()
        if self._handle is None or self._key != key:
            handle = await self._lookups.run(key, lambda: self._create(node_id))
            self._handle, self._key = handle, key
        return self._handle

    def kept(self) -> Any:
        """The kept handle of this node's actor, or None: what :meth:`handle` returns without a lookup."""
        return self._handle if self._key == self._where()[1] else None

    def handle_blocking(self) -> Any:
        """:meth:`handle` made where it is called, for a thread of its own or a driver: a miss waits
        for the GCS there."""
        node_id, key = self._where()
        if self._handle is None or self._key != key:
            self._handle, self._key = self._create(node_id), key
        return self._handle

    @staticmethod
    def _where() -> tuple[str, str]:
        context = connected_context()
        node_id = context.get_node_id()
        return node_id, f"{context.gcs_address}/{node_id}"

    def forget(self, handle: Any) -> None:
        """``handle`` failed (its actor died): the next ``handle()`` gets or creates its successor,
        unless another caller has got it already."""
        if handle is self._handle:
            self._handle = None


def host_actor_name(index: int) -> str:
    """A shared session host (actors/placement.py); its sessions show as its tasks named ``session:<id>``."""
    return f"canopy:sessions:{index}"
