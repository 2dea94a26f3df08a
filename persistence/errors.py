"""Errors the repositories raise, each a clear sentence for a person or a model (a tool error's
text); the API gives each class its HTTP status (api/errors.py)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict, make_conninfo


class CanopyError(Exception):
    """Base class: ``str(error)`` is a clear sentence for a person or a model."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray pickles an actor's error for its caller in another process. Python's default rebuilds
        # an error by calling its class with ``args`` (the sentence alone), which fails for a class
        # whose constructor takes more (Deadlock, SandboxFull, DatabaseUnreachable): the caller got
        # Ray's UnserializableException instead of this error, and handled it as nothing it knew.
        return _rebuilt, (type(self), self.args, self.__dict__)

    @property
    def details(self) -> dict[str, object]:
        """Typed fields a tool error carries beside its sentence (none by default)."""
        return {}


def _rebuilt(cls: type[CanopyError], args: tuple[Any, ...], state: dict[str, Any]) -> CanopyError:
    """An unpickled error: its class, sentence and fields as they were, without calling ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class InvalidArgument(CanopyError):
    """A value the request or tool call gave is not acceptable; nothing was written."""


class NotFound(CanopyError):
    """The object does not exist *in the caller's scope* (another scope's objects look absent)."""


class Conflict(CanopyError):
    """The object's state does not allow this now."""


class LimitExceeded(CanopyError):
    """A configured limit refuses the request; the sentence names the limit and its setting."""


class IdempotencyConflict(Conflict):
    """The same idempotency key was used with different arguments."""


class Deadlock(Conflict):
    """A wait that would close a cycle of waits: no Turn of the cycle could ever resume."""

    def __init__(self, sentence: str, cycle: list[str]) -> None:
        super().__init__(sentence)
        self.cycle = cycle

    @property
    def details(self) -> dict[str, object]:
        return {"error_type": "deadlock", "cycle": self.cycle}


class TurnCancelled(CanopyError):
    """The calling Turn is being cancelled (or its tree stopped): it runs no further tool call."""


class LeaseLost(CanopyError):
    """The calling Run no longer holds its lease: a stale incarnation must stop writing."""


class LimitReached(CanopyError):
    """A per-caller limit is used up; the caller may retry once it has freed something."""


class DatabaseUnreachable(CanopyError):
    """No connection to the configured database; the sentence names it without its password."""

    def __init__(self, url: str, reason: str) -> None:
        shown, hidden = redact_url(url)
        super().__init__(f"cannot reach the database at {shown}{' (password hidden)' if hidden else ''}: {reason} "
                         "— check CANOPY_DATABASE_URL")


# What libpq takes as a secret in a connection string: the password, and the client key's passphrase.
_SECRETS = ("password", "sslpassword")


def redact_url(url: str) -> tuple[str, bool]:
    """``url`` (a URL or a ``key=value`` connection string) without its password; whether it had one."""
    if "://" not in url:
        # libpq's own parser: "password = x" and quoted values with spaces are passwords too.
        try:
            fields = conninfo_to_dict(url)
        except ProgrammingError:
            return "(a connection string libpq cannot read)", True
        kept = {key: value for key, value in fields.items() if key not in _SECRETS}
        return make_conninfo(**kept), len(kept) != len(fields)
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    kept_query = [(key, value) for key, value in query if key.lower() not in _SECRETS]
    hidden = len(kept_query) != len(query)
    if hidden:
        parts = parts._replace(query=urllib.parse.urlencode(kept_query))
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        hidden = hidden or bool(colon and password)
        netloc = f"{user}@{hostport}" if user else hostport
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), hidden


class RayUnreachable(CanopyError):
    """The Ray cluster Canopy is to join (``CANOPY_RAY_ADDRESS``) refused or did not answer."""


class SharedDatabaseRequired(CanopyError):
    """A Ray cluster of several nodes and no database they all reach: each node would start its own."""


def shown(value: object, limit: int = 100, keep: int = 60) -> str:
    """``value`` for an error sentence: whole up to ``limit`` characters, else its first ``keep``. A
    model's argument may be megabytes, and the sentence goes back into every later model call of
    its Turn."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:keep]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:keep]}... ({len(text)} characters)"
