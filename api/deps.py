"""Shared route plumbing: the Runtime of this app, the documented error responses, shared reads."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import Depends, Query, Request

from actors.runtime import Runtime
from api.schemas import ErrorBody, HumanRequest, ValidationErrorBody
from persistence import views
from persistence.records import Scope


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
# Where a page of a list starts: the lists are ordered so that new rows do not shift earlier pages.
Offset = Annotated[int, Query(ge=0, le=1_000_000)]


async def pending_requests(runtime: Runtime, scope: Scope, *, session_id: uuid.UUID | None = None,
                           tree_id: uuid.UUID | None = None) -> list[HumanRequest]:
    """The pending approvals and questions of a session or a tree (404 when it is not the caller's)."""
    async with runtime.db.tx() as conn:
        rows = await views.pending_requests(conn, scope, session_id=session_id, tree_id=tree_id)
    return [HumanRequest.model_validate(row) for row in rows]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers a route may give (all ``{"detail": ...}``)."""
    meanings = {
        401: "Missing or invalid API key.",
        404: "No such object in your scope (another scope's objects look absent).",
        409: "The object's state does not allow this now.",
        413: "Request body over 1 MiB.",
        422: "Invalid request.",
        429: "A per-key limit is used up (see the detail); retry after freeing something.",
    }
    documented: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": meanings.get(code, "Error.")} for code in codes}
    if 422 in codes:
        documented[422] = {"model": ValidationErrorBody, "description": meanings[422]}
    return documented


# Every authenticated route may answer these.
COMMON = (401, 422)
