"""Canopy's errors cross processes as themselves: Ray pickles an actor's error for its caller."""

from __future__ import annotations

import pickle
import traceback

import pytest
import ray.exceptions
from ray import cloudpickle

import actors.sandbox_hosts
import actors.sandbox_tools
import api.up
import persistence.errors as errors
import persistence.idempotency
import sandbox.base
from persistence.migrations import connect

# One of each error class Canopy defines, made as the code makes it.
SAMPLES: list[errors.CanopyError] = [
    errors.CanopyError("a sentence"),
    errors.InvalidArgument("bad"),
    errors.NotFound("no such session"),
    errors.Conflict("not now"),
    errors.LimitExceeded("too many"),
    errors.IdempotencyConflict("other arguments"),
    errors.Deadlock("waiting would deadlock", ["a", "b"]),
    errors.TurnCancelled("cancelled"),
    errors.LeaseLost("lost"),
    errors.LimitReached("used up"),
    errors.DatabaseUnreachable("postgresql://canopy:secret@db/canopy", "connection refused"),
    errors.SharedDatabaseRequired("set CANOPY_DATABASE_URL"),
    errors.RayUnreachable("cannot join"),
    persistence.idempotency.IdempotencyKeyReused("reused"),
    sandbox.base.SandboxError("engine gone"),
    sandbox.base.SandboxUnavailable("no engine"),
    sandbox.base.SandboxGone("vanished"),
    sandbox.base.SandboxFull("the engine is full", 3),
    sandbox.base.SandboxMoved("another node"),
    sandbox.base.WorkdirFull("no room left"),
    sandbox.base.ScopeFull("the user holds the most", ["node-b"]),
    sandbox.base.PathRejected("../x"),
    sandbox.base.FileMissing("x"),
    actors.sandbox_hosts.HostLost("host lost"),
    actors.sandbox_tools.CommandNotStopped("not stopped"),
    api.up.StartupError("cannot start"),
]


def _every_subclass(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _every_subclass(sub)
    return found


# Ray makes a class per error it passes up (`RayTaskError(LeaseLost)`, in `ray.exceptions`) once
# a test in this process has seen one: only the classes Canopy's own packages define count.
_CANOPY_PACKAGES = {"actors", "api", "persistence", "sandbox"}


def test_every_error_class_has_a_sample() -> None:
    # As a Ray call's error that was a LeaseLost reaches its caller, whatever ran before this test.
    ray.exceptions.RayTaskError("step", "traceback", errors.LeaseLost("lost")).as_instanceof_cause()
    canopys = {cls for cls in _every_subclass(errors.CanopyError) if cls.__module__.split(".")[0] in _CANOPY_PACKAGES}
    assert canopys | {errors.CanopyError} == {type(error) for error in SAMPLES}


def test_every_error_unpickles_as_itself() -> None:
    for error in SAMPLES:
        back = pickle.loads(cloudpickle.dumps(error))
        assert type(back) is type(error)
        assert (str(back), back.args, vars(back)) == (str(error), error.args, vars(error))
        assert back.details == error.details
    assert "secret" not in str(pickle.loads(cloudpickle.dumps(SAMPLES[10])))


@pytest.mark.parametrize("url", [
    "host=db password=hunter2 user=canopy",
    "host=db password = hunter2 user=canopy",  # libpq allows spaces around '='
    "host=db password='correct hunter2 horse' user=canopy",  # and quoted values with spaces
    "host=db sslpassword=hunter2 user=canopy",  # the client key's passphrase
    "postgresql://canopy:hunter2@db:5432/canopy",
    "postgresql://canopy@db/canopy?password=hunter2&sslpassword=hunter2&application_name=x",
])
def test_an_unreachable_database_is_named_without_its_secrets(url: str) -> None:
    said = str(errors.DatabaseUnreachable(url, "connection refused"))
    assert "hunter2" not in said and "horse" not in said, said
    assert "(password hidden)" in said and "db" in said and "canopy" in said, said


@pytest.mark.parametrize("url", [
    "postgresql://canopy:s3cr%ZZet@127.0.0.1:1/canopy",  # a stray "%": libpq quotes the token it cannot read
    "postgresql://canopy:s3cr et@127.0.0.1:1/canopy",  # a space
    "postgresql://canopy:s3cr@et@127.0.0.1:1/canopy",  # an "@": libpq takes "et@127.0.0.1" for the host
])
def test_a_url_libpq_cannot_use_is_refused_without_its_password(url: str) -> None:
    """libpq's own sentence for a URL it cannot read quoted the password's part it could not, and was
    raised as it is (a ProgrammingError, in canopy up's traceback and a replica's log)."""
    with pytest.raises(errors.DatabaseUnreachable) as refused:
        connect(url)
    shown = "".join(traceback.format_exception(refused.value))
    assert "s3cr" not in shown and "et@" not in shown, shown
    assert "(password hidden)" in str(refused.value), refused.value
