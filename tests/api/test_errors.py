"""Each Canopy error class answers with its HTTP status: the mapping lives in the API (api/errors.py),
and a subclass answers as its nearest listed ancestor."""

from __future__ import annotations

from api.errors import status_of
from api.up import StartupError
from persistence import errors
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
