"""After-commit hints: activate a session, poke a tree's supervisor, wake waiters.

Every hint is sent only after the facts it points at are committed, and losing one
only delays work: the sweeper re-derives the same hints from the durable facts.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable

import ray

from actors.naming import named_options, session_actor_name, tree_actor_name
from persistence import waits
from persistence.db import Database

log = logging.getLogger(__name__)
_ACTIVATION_ATTEMPTS = 5


async def activate_session(session_id: uuid.UUID) -> None:
    """Get or create the session's actor and tell it to re-read its work.

    A passivating actor may die between lookup and call; then it is created anew.
    """
    from actors.session_actor import SessionActor

    for attempt in range(_ACTIVATION_ATTEMPTS):
        handle = SessionActor.options(**named_options(session_actor_name(session_id))).remote(str(session_id))
        try:
            await handle.signal.remote()
            return
        except ray.exceptions.RayActorError:
            await asyncio.sleep(0.05 * (attempt + 1))
    log.warning("could not activate session %s; the sweep will retry", session_id)


def poke_tree(tree_id: uuid.UUID) -> None:
    """Ask the tree's supervisor to grant free slots (fire and forget)."""
    from actors.tree_supervisor import TreeSupervisor

    try:
        handle = TreeSupervisor.options(**named_options(tree_actor_name(tree_id))).remote(str(tree_id))
        handle.poke.remote()
    except Exception:  # a hint: the sweep re-pokes trees with queued runs
        log.exception("could not poke tree %s", tree_id)


def poke_trees(tree_ids: Iterable[uuid.UUID]) -> None:
    for tree_id in dict.fromkeys(tree_ids):
        poke_tree(tree_id)


async def trees_of(db: Database, session_ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    async with db.tx() as conn:
        cur = await conn.execute("SELECT DISTINCT tree_id FROM sessions WHERE session_id = ANY(%s)",
                                 (list(session_ids),))
        return [row["tree_id"] for row in await cur.fetchall()]


async def resume_wait(db: Database, wait_id: uuid.UUID) -> None:
    """Resume one wait if it is due (idempotent) and poke its tree."""
    async with db.tx() as conn:
        resumed = await waits.try_resume(conn, wait_id)
    if resumed:
        poke_tree(resumed["tree_id"])


async def wake_waiters(db: Database, session_ids: Iterable[uuid.UUID]) -> None:
    """Something changed in these sessions: resume the waits watching them that are now due."""
    ids = list(dict.fromkeys(session_ids))
    if not ids:
        return
    async with db.tx() as conn:
        wait_ids = await waits.waits_watching(conn, ids)
    for wait_id in wait_ids:
        try:
            await resume_wait(db, wait_id)
        except Exception:  # isolated per wait; the sweep retries it
            log.exception("resuming wait %s failed", wait_id)


async def after_change(db: Database, session_ids: Iterable[uuid.UUID]) -> None:
    """The usual hint after a commit touching these sessions: wake waiters, grant slots."""
    ids = list(dict.fromkeys(session_ids))
    await wake_waiters(db, ids)
    poke_trees(await trees_of(db, ids))
