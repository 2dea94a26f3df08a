"""Live events of a session or a tree, as Server-Sent Events (see api/sse.py)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request

from api.auth import ScopeDep
from api.deps import COMMON, RuntimeDep, errors
from api.schemas import MAX_BIGINT
from api.sse import EventStreamResponse, event_stream
from persistence import sessions, views
from persistence.errors import InvalidArgument

router = APIRouter(tags=["events"])

_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "text/event-stream: each event's `id:` is its cursor and its `data:` the Event JSON "
                         "(cursor, kind, session_id, tree_id, turn_id, run_id, payload, created_at). Live model "
                         "text arrives as `event: delta` without an id. Comment lines keep idle streams open.",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **errors(*COMMON, 404),
}
After = Annotated[int | None, Query(ge=0, le=MAX_BIGINT, description="Replay events with a larger cursor.")]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID", max_length=20,
                                           description="Resume after this cursor (wins over ?after).")]
Deltas = Annotated[bool, Query(description="Also stream live model text deltas (not durable).")]


def _start_cursor(after: int | None, last_event_id: str | None) -> int:
    # A reconnecting EventSource repeats the original URL, so its Last-Event-ID must win over ?after.
    if last_event_id is not None and last_event_id.strip():
        value = last_event_id.strip()
        if not value.isdigit() or int(value) > MAX_BIGINT:
            raise InvalidArgument(f"Last-Event-ID {value!r} is not an event cursor")
        return int(value)
    return after or 0


@router.get("/sessions/{session_id}/events", response_class=EventStreamResponse, status_code=200,
            responses=_STREAM_DOC)
async def session_events(session_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                         after: After = None, last_event_id: LastEventId = None,
                         deltas: Deltas = True) -> EventStreamResponse:
    """This session's events, replayed after the cursor then live."""
    start = _start_cursor(after, last_event_id)
    async with runtime.db.tx() as conn:
        await sessions.get_session_row(conn, caller, session_id)
    state = request.app.state
    return EventStreamResponse(event_stream(state.hub, runtime.db, caller, after=start, session_id=session_id,
                                            deltas=deltas, settings=state.stream_settings))


@router.get("/trees/{tree_id}/events", response_class=EventStreamResponse, status_code=200,
            responses=_STREAM_DOC)
async def tree_events(tree_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                      after: After = None, last_event_id: LastEventId = None,
                      deltas: Deltas = True) -> EventStreamResponse:
    """Every member's events of this tree, replayed after the cursor then live."""
    start = _start_cursor(after, last_event_id)
    async with runtime.db.tx() as conn:
        await views.require_tree(conn, caller, tree_id)
    state = request.app.state
    return EventStreamResponse(event_stream(state.hub, runtime.db, caller, after=start, tree_id=tree_id,
                                            deltas=deltas, settings=state.stream_settings))
