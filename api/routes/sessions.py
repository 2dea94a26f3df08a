"""Sessions: roots, their state and history, and a human's actions on one session."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, Offset, QueryInt, RuntimeDep, errors, link_next, pages
from api.schemas import (
    CompactionRequested,
    HumanRequest,
    InputCreate,
    InputReceipt,
    InputSummary,
    Intervention,
    Message,
    RootSession,
    Session,
    SessionCreate,
    SessionCreated,
    SessionUpdate,
    SteerAccepted,
    SteerCreate,
    TurnCancelAccepted,
)
from api.writes import IdempotencyKey, respond_to_write
from persistence import cooperation, projects, sessions, views
from persistence.db import MAX_BIGINT
from persistence.records import Row
from persistence.statuses import InputStatus

router = APIRouter(prefix="/sessions", tags=["sessions"])

# A messages page's text: a page of long messages (up to 10,000 of 100,000 characters) was built
# whole in the API's memory.
MESSAGES_PAGE_BYTES = 4 * 1024 * 1024


def _created(result: Row) -> SessionCreated:
    return SessionCreated(session=Session.model_validate(result["session"]),
                          input=InputReceipt.model_validate(result["input"]) if result["input"] else None)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SessionCreated,
             responses=errors(*COMMON, 404, 413))
async def create_root(body: SessionCreate, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                      idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """A new root session (its own tree). ``input``, when given, is submitted at once."""
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_201_CREATED,
        lambda hook: runtime.create_root(caller, input_text=body.input, agent_id=body.agent_id,
                                         project_id=body.project_id, title=body.title or "",
                                         budget=body.budget.model_dump() if body.budget else None, in_tx=hook),
        _created)


@router.get("", response_model=list[RootSession], responses=pages("roots"))
async def list_roots(
    caller: ScopeDep,
    runtime: RuntimeDep,
    request: Request,
    response: Response,
    scope: Annotated[Literal["project", "all"], Query(
        description="all: every root of your scope; project: the roots of project_id (default: your first "
                    "project)")] = "all",
    project_id: Annotated[uuid.UUID | None, Query(description="Only roots of this project.")] = None,
    offset: Offset = 0,
    limit: Annotated[QueryInt, Query(ge=1, le=100)] = 20,
    include_archived: Annotated[bool, Query(description="Also list archived roots (hidden by default).")] = False,
    before: Annotated[uuid.UUID | None, Query(
        description="Only roots listed after this one (the last of the previous page): pages that roots made "
                    "or archived meanwhile do not shift.")] = None,
) -> list[RootSession]:
    """Root sessions, newest first, each with its tree's attention counts. A full page has a
    ``Link: <…>; rel="next"`` header: the next page, after its last root."""
    async with runtime.db.tx() as conn:
        if project_id is not None:
            await projects.get_project(conn, caller, project_id)
        elif scope == "project":
            first = await projects.list_projects(conn, caller)
            if not first:
                return []
            project_id = first[0]["project_id"]
        rows = await sessions.list_roots(conn, caller, project_id=project_id, offset=offset, limit=limit,
                                         include_archived=include_archived, before=before)
        attention = await views.tree_attention(conn, caller, [row["tree_id"] for row in rows])
    if len(rows) == limit:
        link_next(request, response, "sessions", before=rows[-1]["session_id"], limit=limit)
    return [RootSession.model_validate({**row, "attention": attention[row["tree_id"]]}) for row in rows]


@router.get("/{session_id}", response_model=Session, responses=errors(*COMMON, 404))
async def get_session(session_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> Session:
    async with runtime.db.tx() as conn:
        return Session.model_validate(await sessions.get_session(conn, caller, session_id))


@router.patch("/{session_id}", response_model=Session, responses=errors(*COMMON, 404, 413))
async def update_session(session_id: uuid.UUID, body: SessionUpdate, caller: ScopeDep,
                         runtime: RuntimeDep) -> Session:
    """Edit the display title (the name and path are fixed at creation)."""
    return Session.model_validate(await runtime.set_title(caller, session_id, body.title))


@router.get("/{session_id}/messages", response_model=list[Message], responses=pages("messages"))
async def list_messages(
    session_id: uuid.UUID,
    caller: ScopeDep,
    runtime: RuntimeDep,
    request: Request,
    response: Response,
    after: Annotated[QueryInt, Query(ge=0, le=MAX_BIGINT, description="Only messages with a larger id.")] = 0,
    limit: Annotated[QueryInt, Query(ge=1, le=10_000)] = 1000,
) -> list[Message]:
    """The history, oldest first: role, content, tool calls and results, Turn and Run, origin.

    A page holds at most ``limit`` messages, and ends early once it holds 4 MiB of text (a message
    of any size still comes, alone). While more follow, the response has a ``Link: <…>; rel="next"``
    header: the URL of the next page."""
    async with runtime.db.tx() as conn:
        rows, more = await views.session_messages(conn, caller, session_id, after_id=after, limit=limit,
                                                  max_bytes=MESSAGES_PAGE_BYTES)
    if more:
        link_next(request, response, "messages", after=rows[-1]["id"], limit=limit)
    return [Message.model_validate(row) for row in rows]


@router.get("/{session_id}/interventions", response_model=list[Intervention], responses=errors(*COMMON, 404))
async def list_interventions(
    session_id: uuid.UUID,
    caller: ScopeDep,
    runtime: RuntimeDep,
    after: Annotated[QueryInt, Query(ge=0, le=MAX_BIGINT, description="Only events with a larger cursor.")] = 0,
    limit: Annotated[QueryInt, Query(ge=1, le=1000)] = 200,
) -> list[Intervention]:
    """A human's direct actions (input, steer, answer, cancel) on this session as a member, and on its
    children, oldest first: each is a ``user_intervention`` event of the parent's (SPEC §5)."""
    async with runtime.db.tx() as conn:
        rows = await cooperation.interventions(conn, caller, session_id, after=after, limit=limit)
    return [Intervention.model_validate(row) for row in rows]


@router.get("/{session_id}/inputs", response_model=list[InputSummary], responses=pages("inputs"))
async def list_inputs(
    session_id: uuid.UUID,
    caller: ScopeDep,
    runtime: RuntimeDep,
    request: Request,
    response: Response,
    status: Annotated[InputStatus | None, Query(
        description="Only inputs in this state; pending ones can be cancelled with POST /inputs/{id}/cancel.")] = None,
    after: Annotated[QueryInt, Query(ge=0, le=MAX_BIGINT, description="Only inputs after this place (an input's seq).")
                     ] = 0,
    limit: Annotated[QueryInt, Query(ge=1, le=1000)] = 100,
) -> list[InputSummary]:
    """This session's inputs in queue order (oldest first), each text cut to a preview. While more
    follow, the response has a ``Link: <…>; rel="next"`` header: the URL of the next page."""
    async with runtime.db.tx() as conn:
        rows, more = await views.session_inputs(conn, caller, session_id, status=status, after=after, limit=limit)
    if more:
        link_next(request, response, "inputs", after=rows[-1]["seq"], limit=limit)
    return [InputSummary.model_validate(row) for row in rows]


@router.post("/{session_id}/inputs", status_code=status.HTTP_202_ACCEPTED, response_model=InputReceipt,
             responses=errors(*COMMON, 404, 409, 413))
async def submit_input(session_id: uuid.UUID, body: InputCreate, caller: ScopeDep, runtime: RuntimeDep,
                       request: Request, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Queue work FIFO (started at once when idle). 409 while the session waits for a human."""
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_202_ACCEPTED,
        lambda hook: runtime.submit_input(caller, session_id, body.text, origin_kind=body.origin, in_tx=hook),
        InputReceipt.model_validate)


@router.post("/{session_id}/steer", status_code=status.HTTP_202_ACCEPTED, response_model=SteerAccepted,
             responses=errors(*COMMON, 404, 409, 413))
async def steer(session_id: uuid.UUID, body: SteerCreate, caller: ScopeDep, runtime: RuntimeDep,
                request: Request, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """A correction to the running Turn, read at its next model boundary. 409 without a running Turn."""
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_202_ACCEPTED,
        lambda hook: runtime.steer(caller, session_id, body.text, in_tx=hook), SteerAccepted.model_validate)


@router.post("/{session_id}/turns/{turn_id}/cancel", status_code=status.HTTP_202_ACCEPTED,
             response_model=TurnCancelAccepted, responses=errors(*COMMON, 404))
async def cancel_turn(session_id: uuid.UUID, turn_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep,
                      request: Request, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Cancel exactly this Turn (a finished Turn stays as it is). Children are never cancelled with it."""
    return await respond_to_write(
        request, caller, idempotency_key, None, status.HTTP_202_ACCEPTED,
        lambda hook: runtime.cancel_turn(caller, session_id, turn_id, in_tx=hook),
        lambda _: TurnCancelAccepted(session_id=session_id, turn_id=turn_id))


@router.get("/{session_id}/requests", response_model=list[HumanRequest], responses=errors(*COMMON, 404))
async def session_requests(session_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> list[HumanRequest]:
    """Pending approvals and questions of this session, whole."""
    async with runtime.db.tx() as conn:
        rows = await views.pending_requests(conn, caller, session_id)
    return [HumanRequest.model_validate(row) for row in rows]


@router.post("/{session_id}/archive", response_model=Session, responses=errors(*COMMON, 404, 409))
async def archive(session_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                  idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Hide a root's idle tree from lists (nothing is deleted). 409 while anything in it is busy."""
    return await respond_to_write(
        request, caller, idempotency_key, None, status.HTTP_200_OK,
        lambda hook: runtime.archive_root(caller, session_id, in_tx=hook), Session.model_validate)


@router.post("/{session_id}/compact", status_code=status.HTTP_202_ACCEPTED, response_model=CompactionRequested,
             responses=errors(*COMMON, 404, 409))
async def compact(session_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                  idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Compact the session's history at its next model call: a summary of the messages before that
    Turn stands for them in what the model is sent (they stay in the history and the UI). 409 for an
    archived session."""
    return await respond_to_write(
        request, caller, idempotency_key, None, status.HTTP_202_ACCEPTED,
        lambda hook: runtime.request_compaction(caller, session_id, in_tx=hook),
        lambda asked: CompactionRequested(session_id=asked["session_id"]))
