"""Every error is ``{"detail": "<a sentence>"}`` with a 4xx or 5xx status: a Canopy error's status is
its class's in ``STATUS`` (the nearest listed ancestor's), validation errors become one sentence."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from persistence.db import LockConflict, database_unavailable
from persistence.errors import (
    CanopyError,
    Conflict,
    DatabaseUnreachable,
    InvalidArgument,
    LeaseLost,
    LimitExceeded,
    LimitReached,
    NotFound,
    RayUnreachable,
    SharedDatabaseRequired,
    TurnCancelled,
)
from persistence.idempotency import IdempotencyKeyReused
from sandbox.base import SandboxError

log = logging.getLogger(__name__)

# The HTTP status of each error class; a subclass not listed answers with its nearest listed ancestor's.
STATUS: dict[type[CanopyError], int] = {
    CanopyError: 400,
    InvalidArgument: 422,
    IdempotencyKeyReused: 422,  # the IETF idempotency-key draft's answer to a key reused for another request
    NotFound: 404,
    Conflict: 409,
    TurnCancelled: 409,
    LeaseLost: 409,
    LimitExceeded: 429,
    LimitReached: 429,
    DatabaseUnreachable: 503,
    RayUnreachable: 503,
    SharedDatabaseRequired: 503,
    SandboxError: 503,
}


def status_of(error: CanopyError) -> int:
    """The HTTP status ``error`` answers with."""
    return next(STATUS[cls] for cls in type(error).__mro__ if cls in STATUS)


# A body of 1 MiB can hold 50,000 unknown keys, or one key of a million characters, which the
# answer named (twice): a 422 many times the size of its request. It names the first few, each cut short.
_PROBLEMS_SHOWN = 20
_PART_CHARS = 100


def _cut(text: str) -> str:
    return text if len(text) <= _PART_CHARS else text[:_PART_CHARS] + "…"


def _location(loc: list[str]) -> str:
    return ".".join(loc) or "request"


def _problems(error: RequestValidationError) -> tuple[list[dict[str, Any]], int]:
    """The first problems, for the answer (without the offending input and context: they can be huge
    or not JSON-serialisable), and how many there are."""
    every = error.errors()
    return [{"loc": [_cut(str(part)) for part in problem.get("loc", ())], "msg": _cut(str(problem.get("msg", ""))),
             "type": _cut(str(problem.get("type", "")))} for problem in every[:_PROBLEMS_SHOWN]], len(every)


async def _canopy_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, CanopyError)
    return JSONResponse({"detail": str(error)}, status_code=status_of(error))


async def _validation_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems, count = _problems(error)
    detail = "; ".join(f"{_location(p['loc'])}: {p['msg']}" for p in problems) or "invalid request"
    if count > len(problems):
        detail += f"; and {count - len(problems)} more problems"
    return JSONResponse({"detail": detail, "errors": problems}, status_code=422)


async def _database_refusal(_: Request, error: Exception) -> JSONResponse:
    # A constraint the request validation did not foresee: the database refused the write and
    # nothing was stored. Still the caller's problem (4xx), never a crash.
    if isinstance(error, psycopg.errors.IntegrityError):
        return JSONResponse({"detail": "the request conflicts with stored data; nothing was written"},
                            status_code=409)
    return JSONResponse({"detail": "the database refused a value in the request; nothing was written"},
                        status_code=422)


async def _lock_conflict(_: Request, error: Exception) -> JSONResponse:
    # Another transaction held the rows this request needed, in an order that could not both go on
    # (PostgreSQL aborted this one), or past the lock timeout: nothing was written, and the same
    # request sent again (with its idempotency key) goes through once the other has committed.
    return JSONResponse({"detail": "another change to the same data ran at the same moment; nothing was written: "
                                   "send the request again"}, status_code=409)


# Long enough for a restarting server, short enough that a client polling for state is not left stale.
RETRY_AFTER_SECONDS = 5


async def _database_error(request: Request, error: Exception) -> JSONResponse:
    if not database_unavailable(error):
        raise error  # a 500, its traceback logged: a bug or a failure that a retry would repeat
    # The client's answer is to send the request again, which a 500 does not say. A write cut at its
    # commit may have been committed: its Idempotency-Key makes the second send safe.
    log.warning("%s %s met an unavailable database: %s", request.method, request.url.path, error)
    return JSONResponse({"detail": "the database is unavailable for the moment: send the request again (a write "
                                   "sent again with the same Idempotency-Key is carried out once)"},
                        status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def install(app: FastAPI) -> None:
    app.add_exception_handler(CanopyError, _canopy_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(psycopg.errors.IntegrityError, _database_refusal)
    app.add_exception_handler(psycopg.errors.DataError, _database_refusal)
    for conflict in LockConflict:
        app.add_exception_handler(conflict, _lock_conflict)
    # Its subclasses above keep their own answers: Starlette takes the nearest class in the error's MRO.
    app.add_exception_handler(psycopg.OperationalError, _database_error)
