"""One structured log line per committed state change, and the counters those changes drive.

Every line goes to the logger ``canopy.lifecycle`` at INFO with the change as ``event`` and the
ids it concerns (``tree_id``, ``session_id``, ``turn_id``, ``run_id``, …) as fields of the
record (``extra``): under Ray's JSON logging (actors/runtime.py ``init_ray``) each is one JSON
object per line in the worker's log file, so an operator greps or ships them by id. Lines
carry ids, statuses and kinds only: never a message body, a tool argument, an output or an
error text (which can hold what a model wrote).

Most changes already write an event (persistence/events.py); ``on_events`` is called with them
once their transaction has committed (a failed commit logs and counts nothing). The few changes
that have no event (a Run picked up by its executor, a wait resumed, a sandbox claimed or
released) call ``log_at_commit`` where they are made.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from persistence import metrics
from persistence.db import Connection

if TYPE_CHECKING:
    from persistence.events import _Event

log = logging.getLogger("canopy.lifecycle")

_IDS = ("tree_id", "session_id", "turn_id", "run_id")


def state_change(event: str, **fields: Any) -> None:
    """Log one state change now: ``event`` and its fields, ids as strings (JSON-ready)."""
    extra = {"event": event, **{key: None if value is None else str(value) for key, value in fields.items()}}
    log.info("%s", event.replace("_", " "), extra=extra)


def log_at_commit(conn: Connection, event: str, **fields: Any) -> None:
    """Log the change when the transaction of ``conn`` commits (not at all if it rolls back)."""
    metrics.at_commit(conn, lambda: state_change(event, **fields))


def _ids(event: _Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in _IDS}


def on_events(events: Iterable[_Event]) -> None:
    """The log lines and counts of events written (once committed)."""
    for event in events:
        _on_event(event)


def _on_event(event: _Event) -> None:
    kind, ids, payload = event.kind, _ids(event), event.payload
    if kind == "turn_started":
        metrics.add(metrics.TURNS_STARTED)
        state_change("turn_started", **ids, input_id=payload.get("input_id"))
    elif kind in ("turn_completed", "turn_failed", "turn_cancelled"):
        status = kind.removeprefix("turn_")
        metrics.add(metrics.TURNS_ENDED, status=status)
        state_change("run_ended", **ids, status=status)
        state_change("turn_ended", **ids, status=status)
    elif kind == "turn_cancelling":
        state_change("turn_cancelling", **ids)
    elif kind == "run_started":  # a slot granted
        state_change("run_granted", **ids)
    elif kind.startswith("waiting_"):
        waiting_for = kind.removeprefix("waiting_")
        state_change("run_interrupted", **ids, reason="wait")
        state_change("wait_parked", **ids, waiting_for=waiting_for)
    elif kind == "run_recovered":
        state_change("run_recovered", **ids)
    elif kind == "request_answered":
        state_change("request_answered", **ids, request_id=payload.get("request_id"))
    elif kind in ("tree_stopped", "tree_continued"):
        state_change(kind, **ids)
    elif kind == "session_created":
        metrics.add(metrics.SESSIONS_CREATED)
        if event.session_id == event.tree_id:
            metrics.add(metrics.TREES_CREATED)
        state_change("session_created", **ids)
