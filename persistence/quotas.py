"""How many objects of a kind one scope may hold. The objects a human makes over HTTP (projects,
agents, schedules, conversations) are rows every later read of the scope walks, and schedules are
work the sweeper does for everyone in due order: without a bound, one API key could make millions
of them. (A model's own conversations, create_session mode=root, count too; each lineage bounds
how many it starts, so they are not refused here.)

A create past its kind's limit is refused with ``LimitExceeded`` (429) and writes nothing. The
count is taken under a transaction-scoped advisory lock of the scope and kind, in a statement of
its own after the lock, so that concurrent creates cannot both see room for the last one.
"""

from __future__ import annotations

from typing import Literal

from persistence.db import Connection, advisory_lock, query
from persistence.errors import LimitExceeded
from persistence.records import Scope

Kind = Literal["projects", "agents", "schedules", "roots"]
# How a refusal names what the scope holds, and what frees a place.
_HELD = {"projects": ("projects", "delete an empty one first"), "agents": ("agents", "delete one first"),
         "schedules": ("schedules", "delete one first"), "roots": ("conversations", "archive one first")}


def lock_parts(scope: Scope, kind: Kind) -> tuple[str, ...]:
    return "canopy.scope", kind, scope.user_id, scope.app_id


async def hold(conn: Connection, scope: Scope, kind: Kind) -> None:
    """Hold the scope's lock of ``kind`` until this transaction ends: other creates of that kind in
    the scope wait for it."""
    await advisory_lock(conn, *lock_parts(scope, kind))


async def check_room(conn: Connection, scope: Scope, kind: Kind, limit: int) -> None:
    """Refuse (``LimitExceeded``) a new object of ``kind`` when the scope holds ``limit`` already; else
    hold the lock that keeps the count true until this transaction ends."""
    await hold(conn, scope, kind)
    cur = await conn.execute(query(f"scope_{kind}_count"), {"user_id": scope.user_id, "app_id": scope.app_id})
    row = await cur.fetchone()
    held = int(row["held"]) if row else 0
    if held >= limit:
        noun, remedy = _HELD[kind]
        raise LimitExceeded(f"this user already has {held} {noun} in this app, the most it may have "
                            f"(CANOPY_MAX_{kind.upper()}_PER_SCOPE); {remedy}")
