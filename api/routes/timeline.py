"""Where a tree's time went: its timeline (paged JSON) and the same as a Chrome trace for Perfetto."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from actors.runtime import Runtime
from api.auth import ScopeDep
from api.deps import COMMON, QueryInt, RuntimeDep, errors
from api.schemas import Timeline, Trace
from api.trace import trace_events
from persistence import timeline as repo
from persistence.records import Row, Scope

router = APIRouter(prefix="/trees", tags=["trees"])

MAX_PAGE = 10_000

Since = Annotated[str | None, Query(max_length=repo.MAX_CURSOR, description=(
    "An ISO 8601 time: only what may have changed after it (open intervals, and those that ended after it; "
    "pass the previous read's `as_of`). Or a `next_cursor`: the next page of a read."))]
Limit = Annotated[QueryInt, Query(ge=1, le=MAX_PAGE, description="Intervals and instants per page.")]


@router.get("/{tree_id}/timeline", response_model=Timeline, responses=errors(*COMMON, 404))
async def tree_timeline(tree_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, since: Since = None,
                        limit: Limit = 2_000) -> Timeline:
    """Every member's Runs, queued-for-slot intervals, waits (with the sessions they wait on), approvals,
    questions, model calls and tool calls, and the tree's stop / continue moments, from the durable facts
    in a constant number of queries, paged by a stable cursor."""
    found, following = await _read_page(runtime, caller, tree_id, since, limit)
    return Timeline.model_validate({**found, "next_cursor": following})


@router.get("/{tree_id}/trace", response_model=Trace, response_model_exclude_none=True,
            responses=errors(*COMMON, 404))
async def tree_trace(tree_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, since: Since = None,
                     limit: Limit = MAX_PAGE) -> Trace:
    """The timeline as Chrome trace-event JSON (open it in Perfetto or chrome://tracing): one process per
    member, complete events (`ph: X`) for its intervals, instant events for stop / continue. A tree of
    more than `limit` intervals and instants comes in pages, each a trace of its own: while more follow,
    `otherData.next_cursor` is the `since` of the next. (`canopy tree ID --trace FILE` writes it whole.)"""
    found, following = await _read_page(runtime, caller, tree_id, since, limit)
    more = {"otherData": {"next_cursor": following}} if following else {}
    return Trace.model_validate({**trace_events(found), **more})


async def _read_page(runtime: Runtime, caller: Scope, tree_id: uuid.UUID, since: str | None,
                     limit: int) -> tuple[Row, str | None]:
    """One page of the timeline, and the cursor of the next (None after the last)."""
    moment, page = repo.parse_since(since)
    async with runtime.db.tx() as conn:
        found = await repo.timeline(conn, caller, tree_id, since=moment, page=page, limit=limit)
    following = found.pop("next")
    return found, following.encode() if following else None
