"""The per-tree sandbox lease: which sandbox a tree has, its state, and when it was last used.

One row per tree (``sandbox_leases``). A claim and a release of the same tree serialise on
the row lock: the releaser holds ``FOR UPDATE`` for the whole release, so a claim that
arrives meanwhile blocks in ``lock`` until the release has committed. Only that row is
locked, so every other write of the tree (messages, runs, the ``trees`` row) commits
freely during a release.

States: ``active`` (a sandbox exists, ``handle`` names it), ``released`` (none). The
schema also allows ``releasing``; this module never commits it, because a release runs
inside the locking transaction — a releaser that dies aborts and leaves the lease
``active``, which is always safe (the next claim re-checks the handle).
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid

from persistence.db import Connection, query
from persistence.records import Row


@dataclasses.dataclass(frozen=True)
class SandboxLease:
    tree_id: uuid.UUID
    backend: str
    handle: str | None
    state: str
    last_used_at: datetime.datetime
    updated_at: datetime.datetime

    @classmethod
    def from_row(cls, row: Row) -> SandboxLease:
        return cls(**{field.name: row[field.name] for field in dataclasses.fields(cls)})


async def lock(conn: Connection, tree_id: uuid.UUID, backend: str) -> SandboxLease:
    """The tree's lease row, created (released) if missing, locked until the transaction ends."""
    await conn.execute(query("sandbox_lease_insert"), {"tree_id": tree_id, "backend": backend})
    cur = await conn.execute(query("sandbox_lease_lock"), {"tree_id": tree_id})
    row = await cur.fetchone()
    assert row is not None, "the lease row was inserted above"
    return SandboxLease.from_row(row)


async def get(conn: Connection, tree_id: uuid.UUID) -> SandboxLease | None:
    cur = await conn.execute(query("sandbox_lease_get"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return SandboxLease.from_row(row) if row else None


async def activate(conn: Connection, tree_id: uuid.UUID, backend: str, handle: str) -> None:
    await conn.execute(
        query("sandbox_lease_activate"), {"tree_id": tree_id, "backend": backend, "handle": handle}
    )


async def touch(conn: Connection, tree_id: uuid.UUID) -> bool:
    """Mark the tree's sandbox used now; False if it has no active sandbox."""
    cur = await conn.execute(query("sandbox_lease_touch"), {"tree_id": tree_id})
    return await cur.fetchone() is not None


async def idle_trees(
    conn: Connection, idle_seconds: float, now: datetime.datetime | None = None, limit: int = 100
) -> list[uuid.UUID]:
    """Trees whose active sandbox was unused for ``idle_seconds`` before ``now`` (None: DB clock)."""
    params = {"idle_seconds": idle_seconds, "now": now, "limit": limit}
    cur = await conn.execute(query("sandbox_lease_idle"), params)
    return [row["tree_id"] for row in await cur.fetchall()]


async def lock_if_idle(
    conn: Connection, tree_id: uuid.UUID, idle_seconds: float, now: datetime.datetime | None = None
) -> SandboxLease | None:
    """The lease, locked, if it is still active and idle and nobody holds its lock; else None."""
    params = {"tree_id": tree_id, "idle_seconds": idle_seconds, "now": now}
    cur = await conn.execute(query("sandbox_lease_lock_idle"), params)
    row = await cur.fetchone()
    return SandboxLease.from_row(row) if row else None


async def mark_released(conn: Connection, tree_id: uuid.UUID) -> None:
    params = {"tree_id": tree_id, "state": "released", "handle": None}
    await conn.execute(query("sandbox_lease_set_state"), params)


async def tree_has_running_run(conn: Connection, tree_id: uuid.UUID) -> bool:
    cur = await conn.execute(query("sandbox_tree_running"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return bool(row and row["running"])


async def tree_known(conn: Connection, tree_id: uuid.UUID) -> bool:
    cur = await conn.execute(query("sandbox_tree_known"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return bool(row and row["known"])
