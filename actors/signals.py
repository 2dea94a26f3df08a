"""After-commit hints: activate a session, poke a tree's supervisor, wake waiters.

Every hint is sent only after the facts it points at are committed, and losing one
only delays work: the sweeper re-derives the same hints from the durable facts. Hints
reach sessions and supervisors through the runtime's placement (actors/placement.py),
which knows where they live.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Iterable

from actors.placement import Placement, spawn
from persistence import runs as run_repo
from persistence import waits
from persistence.db import Connection, Database
from persistence.settings import get_settings

log = logging.getLogger(__name__)


async def resume_wait(placement: Placement, db: Database, wait_id: uuid.UUID) -> None:
    """Resume one wait if it is due (idempotent): its resume Run is queued and, when a slot is
    free, granted in the same commit."""
    hints = NO_HINTS
    async with db.tx() as conn:
        resumed = await waits.try_resume(conn, wait_id)
        if resumed:
            hints = await change_hints(conn, [], hand_off_tree=resumed["tree_id"])
    await send_hints(placement, db, hints)


async def _resume_each(placement: Placement, db: Database, wait_ids: list[uuid.UUID]) -> None:
    for wait_id in wait_ids:
        try:
            await resume_wait(placement, db, wait_id)
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


async def activate_granted(placement: Placement, db: Database, session_id: uuid.UUID) -> None:
    """Activate a session a commit just granted a Run, holding its granted Runs nobody owns yet
    while the activation is under way: a dedicated session's activation is a Ray worker start,
    which on a loaded node can outlast a lease, and a grant whose lease ran out untaken is
    recovered as a death of its Turn (five in a row fail it). An activation that fails or gives
    up ends the holding: a session that cannot start still fails its Turn."""
    lease = get_settings().lease_seconds
    activation = spawn(placement.activate(session_id))
    while not (await asyncio.wait({activation}, timeout=lease / 2))[0]:
        try:
            async with db.tx() as conn:
                await run_repo.hold_unowned(conn, session_id, lease)
        except Exception:  # a hint's helper: the lease's own expiry decides as before
            log.warning("could not hold the grants of session %s while it starts", session_id, exc_info=True)


async def send_hints(placement: Placement, db: Database, hints: ChangeHints) -> None:
    """After the commit: sessions granted by the commit are activated and the trees poked first
    (a slot the commit freed is granted while the waiters are evaluated), then the due waits
    are resumed."""
    for session_id in hints.granted_sessions:
        spawn(activate_granted(placement, db, session_id))
    for tree_id in dict.fromkeys(hints.tree_ids):
        placement.poke_tree(tree_id)
    await _resume_each(placement, db, hints.wait_ids)


async def after_change(placement: Placement, db: Database, session_ids: Iterable[uuid.UUID]) -> None:
    """The usual hint after a commit touching these sessions: grant slots, wake waiters."""
    async with db.tx() as conn:
        hints = await change_hints(conn, session_ids)
    await send_hints(placement, db, hints)


async def after_tree_change(placement: Placement, db: Database, tree_id: uuid.UUID) -> None:
    """The hint after a commit that may have changed any member of the tree (Stop all): its tree, and
    the waits watching any member, in whichever tree they wait."""
    async with db.tx() as conn:
        hints = ChangeHints(*await waits.tree_change_targets(conn, tree_id))
    await send_hints(placement, db, hints)
