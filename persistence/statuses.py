"""The fixed value sets of status and kind columns, shared by every layer.

Each enum mirrors one CHECK (... IN (...)) list of persistence/schema.sql (tests/persistence/
test_statuses.py keeps them equal). Members are ``str``: they compare equal to the column's text,
psycopg sends them as text, and JSON carries their plain value, so rows read back as ``str``
compare with them directly.
"""

from __future__ import annotations

import enum


class InputStatus(enum.StrEnum):
    """inputs.status: queued FIFO, taken by a Turn, or withdrawn before it started."""

    PENDING = "pending"
    CONSUMED = "consumed"
    CANCELLED = "cancelled"


class TurnStatus(enum.StrEnum):
    """turns.status."""

    RUNNING = "running"
    WAITING = "waiting"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WaitingFor(enum.StrEnum):
    """turns.waiting_for: what a waiting Turn waits on."""

    COOPERATION = "cooperation"
    APPROVAL = "approval"
    ANSWER = "answer"


class RunStatus(enum.StrEnum):
    """runs.status: pending waits in the tree's FIFO for a slot; running holds one."""

    PENDING = "pending"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunKind(enum.StrEnum):
    """runs.kind: a resume Run continues its Turn after a wait or after its owner died."""

    START = "start"
    RESUME = "resume"


class MessageKind(enum.StrEnum):
    """coop_messages.kind."""

    MESSAGE = "message"
    STEER = "steer"


class WaitKind(enum.StrEnum):
    """waits.kind: what a parked Turn's condition reads."""

    INPUTS = "inputs"
    SESSIONS = "sessions"
    APPROVAL = "approval"
    ANSWER = "answer"


class WaitStatus(enum.StrEnum):
    """waits.status."""

    OPEN = "open"
    RESUMED = "resumed"
    CANCELLED = "cancelled"


class ReceiptState(enum.StrEnum):
    """tool_receipts.state: started has no outcome yet (its Run may have died with it); done holds it."""

    STARTED = "started"
    DONE = "done"


class RequestKind(enum.StrEnum):
    """requests.kind: a human's approval of a sandbox command, or an answer to ask_user."""

    APPROVAL = "approval"
    QUESTION = "question"


class RequestStatus(enum.StrEnum):
    """requests.status."""

    PENDING = "pending"
    ANSWERED = "answered"
    CANCELLED = "cancelled"


class Activity(enum.StrEnum):
    """A session's derived activity (persistence/sessions.py activity()), shown in lists and the UI."""

    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_COOPERATION = "waiting_cooperation"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_ANSWER = "waiting_answer"
    CANCELLING = "cancelling"


TERMINAL_TURN_STATUSES = frozenset({TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED})
OPEN_TURN_STATUSES = frozenset({TurnStatus.RUNNING, TurnStatus.WAITING, TurnStatus.CANCELLING})
