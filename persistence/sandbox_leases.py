"""The per-tree sandbox lease: which sandbox a tree has, its state, and when it was last used.

One row per tree (``sandbox_leases``). States:

- ``released``: no sandbox (``handle`` is NULL);
- ``creating``: a claim is building the sandbox, outside any transaction;
- ``active``: a sandbox exists and ``handle`` names it;
- ``releasing``: a release is removing the sandbox ``handle`` names, outside any transaction.

The row lock is held only while deciding (``lock``): the slow sandbox work (an image pull,
creating, starting or removing a container) is announced by committing ``creating`` or
``releasing`` (``begin``) and runs with no transaction open; it ends with a compare-and-set
(``settle``) that changes nothing when another process took the work over meanwhile. A
``creating`` or ``releasing`` row older than ``TRANSITION_STALE_SECONDS`` (``stale``) belongs to
a process that died, or hangs: the next claim takes the work over. Both kinds of work are
idempotent per tree, so a takeover of a merely slow process is harmless.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Collection

from persistence import lifecycle
from persistence.db import Connection, advisory_lock, query
from persistence.records import Row

# Longer than an image pull or a container removal takes; the bound after which work is taken over.
TRANSITION_STALE_SECONDS = 120.0
# The settled changes that are a tree's sandbox coming or going (logged; see persistence/lifecycle.py).
_LOGGED_CHANGES = {("creating", "active"): "sandbox_claimed", ("releasing", "released"): "sandbox_released",
                   ("active", "released"): "sandbox_released"}


@dataclasses.dataclass(frozen=True)
class SandboxLease:
    tree_id: uuid.UUID
    backend: str
    handle: str | None
    state: str
    last_used_at: datetime.datetime
    updated_at: datetime.datetime
    node_id: str | None  # the Ray node holding the sandbox and its workdir; None: whichever asks
    workdir_lost_at: datetime.datetime | None  # when a command last found that node gone
    stale: bool  # creating/releasing for longer than TRANSITION_STALE_SECONDS

    @classmethod
    def from_row(cls, row: Row) -> SandboxLease:
        return cls(**{field.name: row[field.name] for field in dataclasses.fields(cls)})


async def lock(conn: Connection, tree_id: uuid.UUID, backend: str) -> tuple[SandboxLease, bool]:
    """The tree's lease row, locked until the transaction ends, and whether this call inserted it
    (a new row is ``released``)."""
    params = {"tree_id": tree_id, "stale_seconds": TRANSITION_STALE_SECONDS}
    while True:
        cur = await conn.execute(query("sandbox_lease_insert"), {"tree_id": tree_id, "backend": backend})
        inserted = await cur.fetchone() is not None
        cur = await conn.execute(query("sandbox_lease_lock"), params)
        row = await cur.fetchone()
        if row is not None:
            break
        # A failed first claim deleted the row between the two statements: make it again.
    return SandboxLease.from_row(row), inserted


async def get(conn: Connection, tree_id: uuid.UUID) -> SandboxLease | None:
    params = {"tree_id": tree_id, "stale_seconds": TRANSITION_STALE_SECONDS}
    cur = await conn.execute(query("sandbox_lease_get"), params)
    row = await cur.fetchone()
    return SandboxLease.from_row(row) if row else None


async def begin(conn: Connection, tree_id: uuid.UUID, state: str, backend: str, handle: str | None,
                node_id: str | None = None) -> None:
    """Announce ``creating`` (handle None, on ``node_id``) or ``releasing`` (the handle to remove);
    call under ``lock``."""
    params = {"tree_id": tree_id, "state": state, "backend": backend, "handle": handle, "node_id": node_id}
    await conn.execute(query("sandbox_lease_begin"), params)


async def settle(
    conn: Connection,
    tree_id: uuid.UUID,
    from_state: str,
    from_handle: str | None,
    state: str,
    handle: str | None,
) -> bool:
    """Move the lease from (``from_state``, ``from_handle``) to (``state``, ``handle``); False, and
    nothing changed, if it is no longer in the former."""
    params = {
        "tree_id": tree_id,
        "from_state": from_state,
        "from_handle": from_handle,
        "state": state,
        "handle": handle,
    }
    cur = await conn.execute(query("sandbox_lease_settle"), params)
    settled = await cur.fetchone() is not None
    if settled and (from_state, state) in _LOGGED_CHANGES:
        lifecycle.log_at_commit(conn, _LOGGED_CHANGES[from_state, state], tree_id=tree_id)
    return settled


async def forget_creating(conn: Connection, tree_id: uuid.UUID) -> None:
    """Delete the row of a first claim that failed (still ``creating``, no handle)."""
    await conn.execute(query("sandbox_lease_forget_creating"), {"tree_id": tree_id})


async def touch(conn: Connection, tree_id: uuid.UUID) -> bool:
    """Mark the tree's sandbox used now; False if it has no active sandbox."""
    cur = await conn.execute(query("sandbox_lease_touch"), {"tree_id": tree_id})
    return await cur.fetchone() is not None


async def idle_trees(
    conn: Connection, idle_seconds: float, now: datetime.datetime | None = None, limit: int = 100,
    node_id: str | None = None, scope_of: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    """Trees with no running Run whose active sandbox was unused for ``idle_seconds`` before ``now``
    (None: DB clock), on ``node_id`` or no node in particular (``node_id`` None: on any node), and of
    the scope of tree ``scope_of`` (None: of any scope); least recently used first."""
    return [row["tree_id"] for row in await _idle(conn, idle_seconds, now, limit, node_id, scope_of)]


async def idle_nodes(conn: Connection, idle_seconds: float, limit: int, scope_of: uuid.UUID) -> set[str]:
    """The nodes of the ``limit`` least recently used idle sandboxes of the scope of tree ``scope_of``
    (idle as for ``idle_trees``), on any node."""
    found = await _idle(conn, idle_seconds, None, limit, None, scope_of)
    return {row["node_id"] for row in found if row["node_id"] is not None}


async def _idle(conn: Connection, idle_seconds: float, now: datetime.datetime | None, limit: int,
                node_id: str | None, scope_of: uuid.UUID | None) -> list[Row]:
    params = {"idle_seconds": idle_seconds, "now": now, "limit": limit, "node_id": node_id, "scope_of": scope_of}
    cur = await conn.execute(query("sandbox_lease_idle"), params)
    return await cur.fetchall()


async def stale_transitions(conn: Connection, limit: int = 100, node_id: str | None = None) -> list[uuid.UUID]:
    """Trees whose release or creation was announced more than ``TRANSITION_STALE_SECONDS`` ago and
    never settled, on ``node_id`` or no node in particular (``node_id`` None: on any node)."""
    params = {"stale_seconds": TRANSITION_STALE_SECONDS, "limit": limit, "node_id": node_id}
    cur = await conn.execute(query("sandbox_lease_stale"), params)
    return [row["tree_id"] for row in await cur.fetchall()]


async def lock_if_idle(
    conn: Connection, tree_id: uuid.UUID, idle_seconds: float, now: datetime.datetime | None = None
) -> SandboxLease | None:
    """The lease, locked, if it is still active and idle and nobody holds its lock; else None."""
    params = {"tree_id": tree_id, "idle_seconds": idle_seconds, "now": now}
    cur = await conn.execute(query("sandbox_lease_lock_idle"), params)
    row = await cur.fetchone()
    return SandboxLease.from_row(row) if row else None


async def tree_has_running_run(conn: Connection, tree_id: uuid.UUID) -> bool:
    cur = await conn.execute(query("sandbox_tree_running"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return bool(row and row["running"])


async def scope_held(conn: Connection, tree_id: uuid.UUID) -> int:
    """How many sandboxes the tree's user holds in its app (made or being made), the tree's own aside.
    Counted under the scope's lock of sandboxes, held until the transaction ends: two claims of the
    scope cannot both see room for the last one."""
    cur = await conn.execute(query("sandbox_tree_scope"), {"tree_id": tree_id})
    scope = await cur.fetchone()
    assert scope is not None, f"tree {tree_id} has a lease, so it exists"
    await advisory_lock(conn, "canopy.sandbox-scope", scope["user_id"], scope["app_id"])
    cur = await conn.execute(query("sandbox_scope_held"), {**scope, "tree_id": tree_id})
    row = await cur.fetchone()
    return int(row["held"]) if row else 0


async def tree_known(conn: Connection, tree_id: uuid.UUID) -> bool:
    cur = await conn.execute(query("sandbox_tree_known"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return bool(row and row["known"])


async def release_on_lost_nodes(conn: Connection, alive: set[str]) -> list[uuid.UUID]:
    """Release every sandbox whose node is not in ``alive`` (Ray's live nodes): it went with its node.
    Each lease keeps naming that node, so its tree's next command still finds the node gone and is
    told the workdir is lost (``move_lost``). An empty ``alive`` (a failed listing) releases nothing."""
    if not alive:
        return []
    cur = await conn.execute(query("sandbox_lease_release_lost"), {"alive": sorted(alive)})
    released = await cur.fetchall()
    for row in released:
        lifecycle.log_at_commit(conn, "sandbox_released", tree_id=row["tree_id"], node_id=row["node_id"],
                                reason="node_lost")
    return [row["tree_id"] for row in released]


async def record_nodes(conn: Connection, addresses: dict[str, str]) -> None:
    """Remember the address of each live node (``node id -> address``): where its sandboxes are
    once Ray, started again, knows that node by another id (``adopt``). Forgets the other nodes no
    lease names."""
    await conn.execute(query("ray_nodes_record"), {"node_ids": list(addresses), "addresses": list(addresses.values())})


async def adopt(conn: Connection, known: Collection[str], successors: dict[str, str],
                tree_id: uuid.UUID | None = None) -> list[uuid.UUID]:
    """Move the leases (of ``tree_id``, or all) that name a node outside ``known`` (every node this
    life of the cluster knows, alive or dead) to ``successors[address]``, the live node at the
    address that node had: the same machine, whose disk and engine hold the sandbox still. The trees
    moved."""
    cur = await conn.execute(query("sandbox_lease_adopt"), {
        "known": sorted(known), "addresses": list(successors), "successors": list(successors.values()),
        "tree_id": tree_id})
    moved = await cur.fetchall()
    for row in moved:
        lifecycle.log_at_commit(conn, "sandbox_adopted", tree_id=row["tree_id"], node_id=row["node_id"],
                                from_node_id=row["old_node_id"])
    return [row["tree_id"] for row in moved]


async def move_lost(conn: Connection, tree_id: uuid.UUID, lost_node_id: str, node_id: str) -> bool:
    """``lost_node_id`` left the cluster with the tree's sandbox and workdir: the lease is released,
    names ``node_id`` for the next sandbox, and records the loss. False, nothing changed, if the
    lease no longer names the lost node (another caller moved it first)."""
    params = {"tree_id": tree_id, "lost_node_id": lost_node_id, "node_id": node_id}
    cur = await conn.execute(query("sandbox_lease_lost"), params)
    moved = await cur.fetchone() is not None
    if moved:
        lifecycle.log_at_commit(conn, "sandbox_workdir_lost", tree_id=tree_id, node_id=lost_node_id)
    return moved


async def loss_untold(conn: Connection, tree_id: uuid.UUID, session_id: uuid.UUID) -> bool:
    """Whether the tree's workdir was lost since the session was made and no committed result of
    the session told it so: its next sandbox call does."""
    cur = await conn.execute(query("sandbox_loss_untold"), {"tree_id": tree_id, "session_id": session_id})
    return await cur.fetchone() is not None


async def loss_told(conn: Connection, tree_id: uuid.UUID, session_id: uuid.UUID) -> None:
    """The session was told of the tree's latest workdir loss: in the transaction that commits the
    result that told it, so a crash before that commit leaves the session still to be told."""
    await conn.execute(query("sandbox_loss_told"), {"tree_id": tree_id, "session_id": session_id})


async def pin_node(conn: Connection, tree_id: uuid.UUID, backend: str, node_id: str) -> None:
    """Put the tree's sandbox and workdir on ``node_id`` unless its lease names a node (or has a
    sandbox) already: the tree's first sandbox call decides, a file write as much as a command."""
    await conn.execute(query("sandbox_lease_pin"), {"tree_id": tree_id, "backend": backend, "node_id": node_id})


async def mark_killed(conn: Connection, tree_id: uuid.UUID, command_id: str) -> SandboxLease | None:
    """Keep the kill of the tree's command ``command_id`` (a start of it not yet checked never runs),
    and read the lease as it is now: a start that was checked already found the sandbox active,
    and the caller kills it there. Under the tree's kill lock, as ``was_killed``."""
    await advisory_lock(conn, "canopy.sandbox-kill", tree_id)
    await conn.execute(query("sandbox_kill_keep"), {"tree_id": tree_id, "command_id": command_id})
    return await get(conn, tree_id)


async def was_killed(conn: Connection, tree_id: uuid.UUID, command_id: str) -> bool:
    """Whether the tree's command ``command_id`` was killed: checked after the claim, before the start."""
    await advisory_lock(conn, "canopy.sandbox-kill", tree_id)
    cur = await conn.execute(query("sandbox_kill_find"), {"tree_id": tree_id, "command_id": command_id})
    return await cur.fetchone() is not None

