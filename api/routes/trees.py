"""Whole trees: the summary (with usage and budget), stop all / continue, the budget, and the tree's
human inbox."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, QueryInt, RuntimeDep, errors, link_next, pages
from api.schemas import BudgetUpdate, HumanRequest, TreeBudget, TreeContinued, TreeStopAccepted, TreeSummary
from api.writes import IdempotencyKey, respond_to_write
from persistence import trees, views

router = APIRouter(prefix="/trees", tags=["trees"])


@router.get("/{tree_id}", response_model=TreeSummary, responses=errors(*COMMON, 404))
async def tree_summary(tree_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> TreeSummary:
    """Every member's state in a constant number of queries, without outputs, and the event cursor to
    follow it from (``GET /trees/{tree_id}/events?after=<event_cursor>``)."""
    async with runtime.db.tx() as conn:
        # The cursor first: whatever changes after this read has a larger cursor, so a stream
        # resumed after it misses nothing the summary below did not see.
        cursor = await views.latest_cursor(conn, caller)
        summary = await trees.tree_summary(conn, caller, tree_id)
    return TreeSummary.model_validate({**summary, "event_cursor": cursor})


@router.post("/{tree_id}/stop", status_code=status.HTTP_202_ACCEPTED, response_model=TreeStopAccepted,
             responses=errors(*COMMON, 404, 409))
async def stop_tree(tree_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                    idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Stop all: cancel every in-flight Turn and pause every queue with pending inputs. 409 for an
    archived tree (nothing in it runs)."""
    return await respond_to_write(
        request, caller, idempotency_key, None, status.HTTP_202_ACCEPTED,
        lambda hook: runtime.stop_tree(caller, tree_id, in_tx=hook),
        lambda live: TreeStopAccepted(tree_id=tree_id, signalled_sessions=live))


@router.post("/{tree_id}/continue", status_code=status.HTTP_202_ACCEPTED, response_model=TreeContinued,
             responses=errors(*COMMON, 404, 409))
async def continue_tree(tree_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                        idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Unpause every queue and start pending inputs. 409 while any Turn is still unfinished, while a
    budget that covers the tree is used up (raise it first: ``PATCH /trees/{tree_id}/budget``), and
    for an archived tree."""
    return await respond_to_write(
        request, caller, idempotency_key, None, status.HTTP_202_ACCEPTED,
        lambda hook: runtime.continue_tree(caller, tree_id, in_tx=hook),
        lambda started: TreeContinued(tree_id=tree_id, started_sessions=started))


@router.patch("/{tree_id}/budget", response_model=TreeBudget, responses=errors(*COMMON, 404, 413))
async def update_budget(tree_id: uuid.UUID, body: BudgetUpdate, caller: ScopeDep, runtime: RuntimeDep) -> TreeBudget:
    """Change the tree's budget: a limit left out stays, one given as null is removed. Raising it does
    not restart a tree stopped for its budget: continue it then (``POST /trees/{tree_id}/continue``)."""
    summary = await runtime.set_budget(caller, tree_id, body.model_dump(exclude_unset=True))
    return TreeBudget.model_validate(summary)


@router.get("/{tree_id}/requests", response_model=list[HumanRequest], responses=pages("requests"))
async def tree_inbox(
    tree_id: uuid.UUID,
    caller: ScopeDep,
    runtime: RuntimeDep,
    request: Request,
    response: Response,
    after: Annotated[uuid.UUID | None, Query(description="Only requests after this one (a page's last id).")] = None,
    limit: Annotated[QueryInt, Query(ge=1, le=trees.INBOX_LIMIT)] = trees.INBOX_LIMIT,
) -> list[HumanRequest]:
    """The tree's inbox: the pending approvals and questions of every member, with their paths,
    oldest first, as summaries. A payload field longer than 500 characters (a command, a file's
    content, a question) holds its first 500, ``<field>_chars`` its whole length, and the request is
    ``truncated``: approve from the whole request, ``GET /sessions/{session_id}/requests``. At most
    ``limit`` (1,000, a tree's member limit) per page; while more follow, the response has a
    ``Link: <…>; rel="next"`` header: the URL of the next page."""
    async with runtime.db.tx() as conn:
        rows, more = await views.request_summaries(conn, caller, tree_id, after=after, limit=limit)
    if more:
        link_next(request, response, "requests", after=rows[-1]["id"], limit=limit)
    return [HumanRequest.model_validate(row) for row in rows]
