"""Scheduled inputs of a session: each due time submits the schedule's text once (persistence/schedules.py)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, RuntimeDep, errors
from api.schemas import Schedule, ScheduleCreate
from api.writes import IdempotencyKey, respond_to_write
from persistence.schedules import Rule

router = APIRouter(tags=["schedules"])


@router.post("/sessions/{session_id}/schedules", response_model=Schedule, status_code=status.HTTP_201_CREATED,
             responses=errors(*COMMON, 404, 409))
async def create_schedule(session_id: uuid.UUID, body: ScheduleCreate, caller: ScopeDep, runtime: RuntimeDep,
                          request: Request, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Submit ``text`` to the session at each due time (a cron expression in UTC, or every N seconds).
    Each due time gives exactly one input (origin ``schedule``), across restarts and replicas."""
    rule = Rule(cron=body.cron, interval_seconds=body.every_seconds)
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_201_CREATED,
        lambda hook: runtime.create_schedule(caller, session_id, rule, body.text, body.catch_up, in_tx=hook),
        Schedule.model_validate)


@router.get("/sessions/{session_id}/schedules", response_model=list[Schedule], responses=errors(*COMMON, 404))
async def list_schedules(session_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> list[Schedule]:
    """The session's schedules, with their next and last due times."""
    return [Schedule.model_validate(row) for row in await runtime.list_schedules(caller, session_id)]


@router.delete("/sessions/{session_id}/schedules/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=errors(*COMMON, 404))
async def delete_schedule(session_id: uuid.UUID, schedule_id: uuid.UUID, caller: ScopeDep,
                          runtime: RuntimeDep) -> Response:
    """Stop a schedule (what it fired stays)."""
    await runtime.delete_schedule(caller, session_id, schedule_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
