"""Human in the loop: answer an approval (approve/deny) or a question."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, RuntimeDep, errors
from api.schemas import AnswerAccepted, AnswerCreate
from api.writes import IdempotencyKey, respond_to_write
from persistence.records import Row

router = APIRouter(prefix="/requests", tags=["human in the loop"])


def _accepted(request_row: Row) -> AnswerAccepted:
    return AnswerAccepted(request_id=request_row["request_id"], session_id=request_row["session_id"],
                          turn_id=request_row["turn_id"])


@router.post("/{request_id}/answer", response_model=AnswerAccepted, responses=errors(*COMMON, 404, 409, 413))
async def answer(request_id: uuid.UUID, body: AnswerCreate, caller: ScopeDep, runtime: RuntimeDep,
                 request: Request, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """``{decision: approve|deny}`` for an approval, ``{answer}`` for a question; the Turn resumes.

    409 when the request was already answered or cancelled.
    """
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_200_OK,
        lambda hook: runtime.answer_request(caller, request_id, body.response(), in_tx=hook), _accepted)
