"""Inputs and Turns by exact identity: cancel a queued input, read an exact result."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, RuntimeDep, errors
from api.schemas import InputCancelled, Result
from api.writes import IdempotencyKey, respond_to_write

router = APIRouter(tags=["inputs and turns"])


@router.post("/inputs/{input_id}/cancel", response_model=InputCancelled, responses=errors(*COMMON, 404, 409))
async def cancel_input(input_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                       idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Cancel an input that has no Turn yet (its waiters wake). 409 once it has a Turn: cancel the Turn."""
    return await respond_to_write(
        request, caller, idempotency_key, None, status.HTTP_200_OK,
        lambda hook: runtime.cancel_input(caller, input_id, in_tx=hook), InputCancelled.model_validate)


@router.get("/inputs/{input_id}/result", response_model=Result, responses=errors(*COMMON, 404))
async def input_result(input_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> Result:
    """The exact result of this input: the output of its Turn's ``result_run_id``."""
    return Result.model_validate(await runtime.result(caller, input_id=input_id))


@router.get("/turns/{turn_id}/result", response_model=Result, responses=errors(*COMMON, 404))
async def turn_result(turn_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> Result:
    return Result.model_validate(await runtime.result(caller, turn_id=turn_id))
