"""Small value types shared by the repositories and their callers."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

Row = dict[str, Any]

TERMINAL_TURN_STATUSES = frozenset({"completed", "failed", "cancelled"})
OPEN_TURN_STATUSES = frozenset({"running", "waiting", "cancelling"})


@dataclasses.dataclass(frozen=True)
class Scope:
    """Who owns an object: every read and write is confined to one (user, app)."""

    user_id: str
    app_id: str


@dataclasses.dataclass(frozen=True)
class RunRef:
    """The identity of an executing Run, as its actor holds it under a lease."""

    scope: Scope
    session_id: uuid.UUID
    tree_id: uuid.UUID
    turn_id: uuid.UUID
    run_id: uuid.UUID
    owner: str
    kind: str = "start"  # or "resume": after a wait, or after its owner died


def new_id() -> uuid.UUID:
    return uuid.uuid4()
