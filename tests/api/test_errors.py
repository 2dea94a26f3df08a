"""Each Canopy error class answers with its HTTP status: the mapping lives in the API (api/errors.py),
and a subclass answers as its nearest listed ancestor."""

from __future__ import annotations

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from api.errors import status_of
from api.up import StartupError
from persistence import errors
from persistence.db import database_unavailable
from persistence.errors import CanopyError
from persistence.idempotency import IdempotencyKeyReused
from sandbox.base import FileMissing, PathRejected, SandboxError, SandboxGone, SandboxUnavailable

EXPECTED: dict[type[CanopyError], int] = {
    CanopyError: 400, StartupError: 400,
    errors.InvalidArgument: 422, PathRejected: 422, IdempotencyKeyReused: 422,
    errors.NotFound: 404, FileMissing: 404,
    errors.Conflict: 409, errors.IdempotencyConflict: 409, errors.Deadlock: 409, errors.TurnCancelled: 409,
    errors.LeaseLost: 409,
    errors.LimitExceeded: 429, errors.LimitReached: 429,
    errors.DatabaseUnreachable: 503, errors.SharedDatabaseRequired: 503,
    SandboxError: 503, SandboxUnavailable: 503, SandboxGone: 503,
}


def test_every_error_class_answers_with_its_status() -> None:
    # Instances without running __init__: some constructors need arguments that do not matter here.
    found = {cls: status_of(cls.__new__(cls)) for cls in EXPECTED}
    assert found == EXPECTED


def test_persistence_errors_carry_no_http_status() -> None:
    classes = [value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, Exception)]
    assert errors.NotFound in classes
    assert [cls.__name__ for cls in classes if "status_code" in vars(cls)] == []


async def _error_of(database_url: str, statement: str) -> psycopg.Error:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as raised:
            await conn.execute(statement)  # type: ignore[arg-type]
    return raised.value


async def test_only_a_database_that_cannot_serve_answers_503(database_url: str) -> None:
    """503 with Retry-After tells a client to send the request again (tests/actors/test_database_restart.py
    shows it during a crash); a statement that failed would fail again, and stays a 500 with its
    traceback logged. Errors of a real server."""
    terminated = await _error_of(database_url, "SELECT pg_terminate_backend(pg_backend_pid())")  # 57P01
    timed_out = await _error_of(database_url, "SET statement_timeout = 1; SELECT pg_sleep(1)")  # 57014
    # Refused before anything is allocated: 2^30 bytes is past the largest allocation (54000).
    too_long = await _error_of(database_url, "SELECT repeat('x', 1 << 30)")
    with pytest.raises(psycopg.OperationalError) as refused:
        await psycopg.AsyncConnection.connect(database_url + "&port=9" if "?" in database_url else
                                              database_url + "?port=9", connect_timeout=2)
    async with AsyncConnectionPool(database_url, min_size=1, max_size=1, timeout=0.2) as pool, pool.connection():
        with pytest.raises(PoolTimeout) as no_connection:
            async with pool.connection():
                pass
    assert [database_unavailable(error) for error in (terminated, refused.value, no_connection.value)] == [True] * 3
    assert [database_unavailable(error) for error in (timed_out, too_long)] == [False, False]
    assert (timed_out.sqlstate, too_long.sqlstate) == ("57014", "54000")
