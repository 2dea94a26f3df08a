"""Which node's sandbox a tree uses, and the per-node sandbox host that runs the tree's commands there.

A tree's sandbox (a container, or the local backend's directory) and its workdir live on one Ray
node, the one its lease names (``sandbox_leases.node_id``). Every node has a sandbox host,
``canopy:sandbox:<node id>`` (pinned to the node, created by the first process there that needs
it), which owns the node's SandboxManager (sandbox/manager.py) and so its Docker client: every
command, file read and write and kill of a tree whose sandbox is on that node runs in that host,
wherever the session asking runs. ``host_for`` is the one place that decides which host.

A tree with no node yet (no lease, or one from before nodes were recorded) uses the caller's node,
recorded by that first call, a file read or write as much as a command (a file written on one node
while a later command made the sandbox on another would be on the first node's disk). A host is
never created on another node: one is looked up by name, and only on a node Ray lists alive. A host
reaches a tree's workdir only while the lease names its node (``refuse_elsewhere``): a call routed
by an older lease is refused there, and makes nothing. When the lease's node has left the cluster
(or its host is gone for good) the sandbox and its workdir went with it: the lease is released,
moved to the caller's node and stamped ``workdir_lost_at`` in one compare-and-set (one caller moves
it; another that found the node gone at the same time reads the lease again and goes where it was
moved). Every member of the tree made before the loss is then told, once: its next sandbox call's
tool result says so (``workdir_lost`` and :data:`WORKDIR_LOST`), and the commit of that result
records it told (``workdir_losses_told``), so a crash before that commit tells it again. The command
runs in a new sandbox on the caller's node, from what is durable: nothing of the old workdir is
carried over, and no member's model is left to find it empty unwarned.

A node that is not lost but started again is not a loss: Ray gives every node a new id each time it
starts (``canopy up`` after a crash, a cluster brought back), so a lease naming a node this life of
the cluster does not know at all (not even as dead) is followed to the live node at the address that
node had (recorded by the sweeper, ``ray_nodes``): the same machine, whose disk holds the workdir and
whose engine the sandbox, with any command still running in it (``adopt``). A node the cluster knows
as dead left it: its trees are told.

A user's limit of sandboxes counts every node, and a node can release only its own: a claim past
it with none of the user's idle on its node asks the hosts of the nodes that hold idle ones to
release one, and claims again.

Idle release and orphan reaping run per node, in each host (``EveryNode``: the
sweeper asks every live node's existing host), because only a node's own engine can remove its
sandboxes. A lost node has no host left to ask: the sweeper releases its sandboxes itself
(``release_on_lost_nodes``), keeping the lost node in each lease, so the tree's next command is
still the one told of the loss. Killing a command goes to the host of the lease's node; a lost
node's commands died with it, so there is nothing to kill.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from pathlib import Path
from typing import Any

import ray

from actors.liveness import AnswersApart, answering_actor
from actors.naming import NAMESPACE, NodeLocal, live_nodes, node_local_options, node_table, sandbox_host_name
from persistence import receipts
from persistence import runs as run_repo
from persistence import sandbox_leases as leases
from persistence.db import Database, LazyDatabase
from persistence.records import RunRef
from persistence.sandbox_leases import SandboxLease
from persistence.settings import get_settings
from sandbox import files, workdirs
from sandbox.base import SandboxError, SandboxMoved, ScopeFull
from sandbox.manager import SandboxManager, refuse_elsewhere

log = logging.getLogger(__name__)

WORKDIR_LOST = (
    "the node that held this tree's sandbox left the cluster, and the workdir went with it: files written "
    "and programs installed before are gone. This and later calls run in a new, empty sandbox on another node")
HOST_LOST = ("the sandbox host stopped while this call ran (its node left the cluster, or it died): whether "
             "the call took effect is unknown")
# Each round of routing a call either finds the lease's node or moves the lease off a lost one; only
# nodes lost one after another, each while a call was routed, keep it going.
_ROUTE_ATTEMPTS = 5


class HostLost(SandboxError):
    """The sandbox host stopped while a call ran in it (:data:`HOST_LOST`). Ray restarts a host that
    died (its node's next call gets it, failing while it restarts); a lost node's host is gone."""


class SandboxHostImpl(AnswersApart):
    """One node's sandboxes: the SandboxManager of the node, for the callers of every node."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self._node_id = node_id
        self._db = LazyDatabase(max_size=4)
        self._manager: SandboxManager | None = None
        self._lock = asyncio.Lock()

    async def _sandboxes(self) -> SandboxManager:
        async with self._lock:
            if self._manager is None:
                db = await self._db.get()
                self._manager = await asyncio.to_thread(SandboxManager.from_settings, db, node_id=self._node_id)
            return self._manager

    # The tool methods answer the tool's result (the sandbox tools, actors/sandbox_tools.py).

    async def _workdir(self, tree_id: uuid.UUID, workdir: str) -> Path:
        """The tree's workdir, made (and its disk mounted) here; SandboxMoved, nothing made, when the
        tree's lease puts it on another node (the caller routed by an older lease: a workdir made here
        would be another, empty one, and a file written to it lost to the tree)."""
        db = await self._db.get()
        async with db.tx() as conn:
            refuse_elsewhere(await leases.get(conn, tree_id), self._node_id)
        return await _ready(workdir)

    async def run_command(self, tree_id: uuid.UUID, workdir: str, command: str, timeout_seconds: float,
                          command_id: str) -> dict[str, object]:
        manager = await self._sandboxes()
        ready = await self._workdir(tree_id, workdir)
        try:
            result = await manager.run_command(tree_id, ready, command, timeout_seconds, command_id=command_id)
        except ScopeFull as full:  # nothing ran: the claim was refused before its sandbox was made
            if not await _room_on(full.nodes, tree_id):
                raise
            result = await manager.run_command(tree_id, ready, command, timeout_seconds, command_id=command_id)
        return result.as_tool_result()

    async def make_room_in_scope(self, tree_id: uuid.UUID) -> bool:
        return await (await self._sandboxes()).make_room_in_scope(tree_id)

    async def kill_command(self, tree_id: uuid.UUID, command_id: str) -> bool:
        return await (await self._sandboxes()).kill_command(tree_id, command_id)

    async def read_file(self, tree_id: uuid.UUID, workdir: str, path: str) -> dict[str, object]:
        ready = await self._workdir(tree_id, workdir)
        return {"path": path, "content": await asyncio.to_thread(files.read_file, ready, path)}

    async def write_file(self, workdir: str, path: str, content: str, run: RunRef, call_id: str,
                         key: dict[str, str]) -> dict[str, object]:
        """Under the fence of ``run`` (LeaseLost when it no longer holds its lease): a Run that
        stalled past its lease, its Turn resumed by another Run meanwhile, must not write over
        what that one wrote since. The fence's row lock holds the Run's recovery off until the
        write is done. The call's receipt (``key``: its path and content's digest) commits with the
        write: a Run that asks again, its caller having died before it heard back, gets the
        receipt, and does not write the old bytes over what another member wrote since."""
        ready = await self._workdir(run.tree_id, workdir)
        db = await self._db.get()
        async with db.tx() as conn:
            await run_repo.fence(conn, run)
            if (written := await receipts.begin_call(conn, run, call_id, "write_file", key)) is not None:
                return dict(written)
            result = {"path": path, "bytes": await asyncio.to_thread(files.write_file, ready, path, content)}
            await receipts.store_result(conn, run, call_id, "write_file", key, result)
        return result

    async def release_idle(self) -> list[uuid.UUID]:
        return await (await self._sandboxes()).release_idle()

    async def reap_orphans(self) -> list[str]:
        return await (await self._sandboxes()).reap_orphans()


SandboxHost = answering_actor(SandboxHostImpl)


# One preparation of a workdir at a time in this process: the others wait here, not in the
# executor's few threads, which a long first copy into a workdir's disk image would fill.
_preparing: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


async def _ready(workdir: str) -> Path:
    """The workdir, made (and its disk image mounted) on this node: every use of it comes here first."""
    path = Path(workdir)
    lock = _preparing.setdefault(workdir, asyncio.Lock())
    async with lock:
        await asyncio.to_thread(workdirs.prepare, path, get_settings().sandbox_workdir_mb)
    return path


def _create(node_id: str) -> Any:
    return SandboxHost.options(**node_local_options(sandbox_host_name(node_id), node_id, max_concurrency=1000)) \
        .remote(node_id)


_local = NodeLocal(_create)


def _here() -> str:
    return ray.get_runtime_context().get_node_id()


async def _alive_nodes() -> set[str]:
    return set(await asyncio.to_thread(live_nodes))


async def _adopt(db: Database, prefer: str, tree_id: uuid.UUID | None = None,
                 table: dict[str, tuple[bool, str]] | None = None) -> list[uuid.UUID]:
    """Leases (of ``tree_id``, or all) naming a node of an earlier life of the cluster, moved to the
    live node of that node's machine (``prefer`` where it is one of several there): the trees moved.
    Also records this life's live nodes, for the next one. ``table``: Ray's ``node_table``, when the
    caller has read it."""
    table = table if table is not None else await asyncio.to_thread(node_table)
    successors: dict[str, str] = {}
    for node_id, (alive, address) in sorted(table.items()):
        if alive and (address not in successors or node_id == prefer):
            successors[address] = node_id
    async with db.tx() as conn:
        await leases.record_nodes(conn, {node_id: address for node_id, (alive, address) in table.items() if alive})
        return await leases.adopt(conn, table, successors, tree_id)


async def _existing_host(node_id: str) -> Any | None:
    """The host of ``node_id`` if that node is alive and its host exists; never creates one."""
    if node_id not in await _alive_nodes():
        return None
    try:
        return await asyncio.to_thread(ray.get_actor, sandbox_host_name(node_id), namespace=NAMESPACE)
    except ValueError:
        return None


async def _host_on(node_id: str | None, here: str) -> Any | None:
    """The sandbox host of a lease's node: this node's (made if missing) for this node or none (a
    sandbox from before nodes were recorded), another live node's if it exists, else None."""
    return await _local.handle() if node_id in (None, here) else await _existing_host(node_id)


async def _room_on(nodes: list[str], tree_id: uuid.UUID) -> bool:
    """Whether the host of one of ``nodes`` released an idle sandbox of the tree's user, whose limit
    (``CANOPY_SANDBOX_MAX_PER_SCOPE``) counts every node while a node releases only its own."""
    for node_id in nodes:
        try:
            host = await _existing_host(node_id)
            if host is not None and await call(host, "make_room_in_scope", tree_id):
                return True
        except Exception:  # that node's refusal stands; another may have room
            log.exception("the sandbox host of node %s could not make room for tree %s", node_id, tree_id)
    return False


async def _lease(db: Database, tree_id: uuid.UUID) -> SandboxLease | None:
    async with db.tx() as conn:
        return await leases.get(conn, tree_id)


async def host_for(db: Database, tree_id: uuid.UUID, session_id: uuid.UUID) -> tuple[Any, bool]:
    """The host to run the tree's sandbox work in, and whether the calling session is still to be
    told that the tree's workdir was lost (this call found its node gone and moved the lease to
    this node, or an earlier call of another member did: see the module's docstring)."""
    here = _here()
    for _ in range(_ROUTE_ATTEMPTS):
        lease = await _lease(db, tree_id)
        if lease is None or lease.node_id is None:
            # The first call decides the node, a file write as much as a command: a file written here
            # while a later command made the sandbox on another node would be on this node's disk only.
            async with db.tx() as conn:
                await leases.pin_node(conn, tree_id, get_settings().sandbox_backend, here)
                lease = await leases.get(conn, tree_id)
        if (host := await _host_on(lease.node_id if lease else None, here)) is not None:
            break
        if await _adopt(db, here, tree_id):
            continue  # a node of an earlier life of the cluster, on a machine that is back
        async with db.tx() as conn:
            if await leases.move_lost(conn, tree_id, lease.node_id, here):
                log.warning("tree %s: the node %s of its sandbox is gone; its workdir is lost", tree_id,
                            lease.node_id)
        # Moved here by this call, or by another member's just before to wherever that one runs,
        # which may be another live node: the lease, read again, says which.
    else:
        raise SandboxMoved(f"the tree's sandbox kept moving while this call looked for it ({_ROUTE_ATTEMPTS} "
                           "times); ask again")
    lost = lease is not None and lease.workdir_lost_at is not None
    if lost:
        async with db.tx() as conn:
            lost = await leases.loss_untold(conn, tree_id, session_id)
    return host, lost


async def call(host: Any, method: str, *args: Any) -> Any:
    """``method`` of a sandbox host. Cancelling the caller cancels it in the host (a command is
    killed); the host's own errors are raised as themselves, not as Ray's wrapper."""
    pending = getattr(host, method).remote(*args)
    try:
        return await pending
    except asyncio.CancelledError:
        ray.cancel(pending)
        raise
    except ray.exceptions.RayTaskError as error:
        raise error.cause from None
    except ray.exceptions.RayActorError as error:  # died or unreachable mid-call: what it did is unknown
        _local.forget(host)  # if it was this node's, the next call gets its successor
        raise HostLost(HOST_LOST) from error


async def kill_command(db: Database, tree_id: uuid.UUID, command_id: str) -> bool:
    """Kill the tree's command ``command_id`` in the host of its sandbox's node; False if it did not
    run (a lost node's commands died with it)."""
    here, lease = _here(), await _lease(db, tree_id)
    for _ in range(_ROUTE_ATTEMPTS):
        node_id = lease.node_id if lease else None
        if (host := await _host_on(node_id, here)) is not None:
            return bool(await call(host, "kill_command", tree_id, command_id))
        # A node of an earlier life follows its machine, moved by this call or by another caller since
        # the lease was read (which leaves this call nothing to adopt): the lease, read again, says.
        await _adopt(db, here, tree_id)
        if (lease := await _lease(db, tree_id)) is None or lease.node_id == node_id:
            return False
    raise SandboxMoved(f"the tree's sandbox kept moving while this kill looked for it ({_ROUTE_ATTEMPTS} times)")


async def release_on_lost_nodes(db: Database) -> list[uuid.UUID]:
    """Release the sandboxes of nodes that left the cluster (their trees' next commands are told the
    workdir is lost); the trees released. Ray declares a node dead for good: it never comes back.
    Leases naming a node of an earlier life of the cluster follow its machine first (``_adopt``)."""
    table = await asyncio.to_thread(node_table)
    await _adopt(db, _here(), table=table)
    alive = {node_id for node_id, (is_alive, _) in table.items() if is_alive}
    async with db.tx() as conn:
        released = await leases.release_on_lost_nodes(conn, alive)
    if released:
        log.warning("released the sandboxes of %d tree(s) whose node left the cluster", len(released))
    return released


class EveryNode:
    """Every live node's sandboxes, for the sweeper as one manager: each call asks each node's host.
    The sweeper's own node's host is made if missing, another node's only asked if it exists (a node
    whose processes never used a sandbox has none). One node's failure is logged and skipped."""

    async def release_idle(self) -> list[uuid.UUID]:
        return await self._each_node("release_idle")

    async def reap_orphans(self) -> list[str]:
        return await self._each_node("reap_orphans")

    async def _each_node(self, method: str) -> list[Any]:
        here, found = _here(), []
        for node_id in sorted(await _alive_nodes()):
            host = await _local.handle() if node_id == here else await _existing_host(node_id)
            if host is None:
                continue
            try:
                found += await call(host, method)
            except Exception:
                log.exception("%s in the sandbox host of node %s failed; the next round retries", method, node_id)
        return found
