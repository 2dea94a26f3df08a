"""Small value types shared by the repositories and their callers."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from persistence.statuses import RunKind

Row = dict[str, Any]



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
    kind: str = RunKind.START  # or resume: after a wait, or after its owner died


def new_id() -> uuid.UUID:
    return uuid.uuid4()
