"""A Run found its tree's budget used up: the tree stops as Stop all stops it (see persistence/usage.py)."""

from __future__ import annotations

import asyncio
import uuid

from actors import signals
from actors.placement import Placement
from persistence import trees
from persistence.db import Database, retrying_deadlocks
from persistence.records import RunRef


async def stop_tree(placement: Placement, db: Database, run: RunRef) -> bool:
    """Stop the Run's tree for its budget (committed first: in-flight Turns cancelled, queues paused,
    the reason and the limit recorded), then tell its other live members, whose model calls are
    interrupted. The Run's own Turn is then cancelling: its caller ends it. False when the limit
    is no longer reached under the tree's lock (a raised budget): the Run goes on."""
    async def stopping() -> list[uuid.UUID] | None:
        async with db.tx() as conn:
            return await trees.stop_for_budget(conn, run.scope, run.tree_id, run.turn_id)

    live = await retrying_deadlocks(stopping)
    if live is None:
        return False
    await asyncio.gather(*(placement.activate(session_id) for session_id in live
                           if session_id != run.session_id))
    await signals.after_tree_change(placement, db, run.tree_id)
    return True
