"""Live events of a session or a tree, as Server-Sent Events (see api/sse.py)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from actors.runtime import Runtime
from api.auth import KeyDep, unauthorized
from api.deps import COMMON, WHOLE_NUMBER, RuntimeDep, errors
from api.sse import EventStreamResponse, StreamLease, event_stream
from persistence import open_streams, stream_watchers, views
from persistence.db import MAX_BIGINT
from persistence.errors import InvalidArgument
from persistence.scopes import ApiKey

router = APIRouter(tags=["events"])

_STREAM_ROUTE: dict[str, Any] = {
    "response_class": EventStreamResponse,
    "status_code": 200,
    "responses": {
        200: {"description": "text/event-stream: each event's `id:` is its cursor and its `data:` the Event JSON "
                             "(cursor, kind, session_id, tree_id, turn_id, run_id, payload, created_at). Live model "
                             "text arrives as `event: delta` without an id. Comment lines keep idle streams open.",
              "content": {"text/event-stream": {"schema": {"type": "string"}}}},
        204: {"description": "The session's tree is archived and no event follows the cursor: the stream has "
                             "ended for good (EventSource stops reconnecting)."},
        **errors(*COMMON, 404, 429),
    },
}
Cursor = Annotated[int, Field(ge=0, le=MAX_BIGINT)]


def _cursor_or_latest(value: object) -> object:
    # Checked before the union, each of whose members would report an error of its own.
    if value == "latest" or not isinstance(value, str) or WHOLE_NUMBER.fullmatch(value):
        return value
    raise PydanticCustomError("int_parsing", "Input should be an event cursor (a whole number written in digits) "
                                             "or 'latest'")


After = Annotated[Cursor | Literal["latest"] | None, BeforeValidator(_cursor_or_latest), Query(
    description="Replay events with a larger cursor; `latest`: no replay, only events committed from now on.")]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID", max_length=20,
                                           description="Resume after this cursor (wins over ?after).")]
Deltas = Annotated[bool, Query(description="Also stream live model text deltas (not durable).")]


@dataclasses.dataclass(frozen=True)
class StreamQuery:
    """Where a stream starts (a cursor, or ``latest``: read when the stream opens) and what it carries."""

    start: int | Literal["latest"]
    deltas: bool


def _stream_query(after: After = None, last_event_id: LastEventId = None, deltas: Deltas = True) -> StreamQuery:
    # A reconnecting EventSource repeats the original URL, so its Last-Event-ID must win over ?after.
    if last_event_id is not None and last_event_id.strip():
        value = last_event_id.strip()
        # A header's bytes decode as Latin-1, and str.isdigit() also takes "²", which int() refuses.
        if not WHOLE_NUMBER.fullmatch(value) or not 0 <= int(value) <= MAX_BIGINT:
            raise InvalidArgument(f"Last-Event-ID {value!r} is not an event cursor")
        return StreamQuery(int(value), deltas)
    return StreamQuery(after or 0, deltas)


StreamQueryDep = Annotated[StreamQuery, Depends(_stream_query)]


async def _open(request: Request, runtime: Runtime, caller: ApiKey, query: StreamQuery, *,
                session_id: uuid.UUID | None = None, tree_id: uuid.UUID | None = None) -> Response:
    """Check the session or tree is the caller's, fix the start cursor, take a place among the
    key's open streams (429 when they are all taken), and stream; 204 when its tree is archived
    and nothing follows the cursor."""
    state = request.app.state
    streams = state.stream_settings
    async with runtime.db.tx() as conn:
        target = await views.require_target(conn, caller.scope, session_id=session_id, tree_id=tree_id)
        start = await views.latest_cursor(conn, caller.scope) if query.start == "latest" else query.start
        if await views.stream_finished(conn, caller.scope, after=start, session_id=session_id, tree_id=tree_id,
                                       target=target):
            # EventSource reconnects on anything else; a 204 is cacheable unless told otherwise.
            return Response(status_code=204, headers={"Cache-Control": "no-store"})
        watched = target["tree_id"] if query.deltas else None
        if watched is not None:  # model calls of the tree stream their text from now on
            await stream_watchers.watch(conn, watched, streams.watch_seconds)
        stream_id = await open_streams.open_stream(conn, caller.key_id, limit=runtime.settings.max_streams_per_key,
                                                   seconds=streams.lease_seconds)
        if stream_id is None:  # inside the transaction: a refused stream leaves no watch behind
            raise unauthorized("invalid, expired or revoked API key")
    lease = StreamLease(runtime.db, stream_id, caller.key_id)
    return EventStreamResponse(event_stream(state.hub, runtime.db, caller.scope, after=start, session_id=session_id,
                                            tree_id=tree_id, watched_tree_id=watched, settings=streams, lease=lease),
                               lease=lease, settings=streams)


@router.get("/sessions/{session_id}/events", **_STREAM_ROUTE)
async def session_events(session_id: uuid.UUID, caller: KeyDep, runtime: RuntimeDep, request: Request,
                         query: StreamQueryDep) -> Response:
    """This session's events, replayed after the cursor then live; once its tree is archived, up to
    the last one. 429 when the API key already holds its most open streams
    (CANOPY_MAX_STREAMS_PER_KEY)."""
    return await _open(request, runtime, caller, query, session_id=session_id)


@router.get("/trees/{tree_id}/events", **_STREAM_ROUTE)
async def tree_events(tree_id: uuid.UUID, caller: KeyDep, runtime: RuntimeDep, request: Request,
                      query: StreamQueryDep) -> Response:
    """Every member's events of this tree, replayed after the cursor then live; once the tree is
    archived, up to the last one. 429 when the API key already holds its most open streams
    (CANOPY_MAX_STREAMS_PER_KEY)."""
    return await _open(request, runtime, caller, query, tree_id=tree_id)
