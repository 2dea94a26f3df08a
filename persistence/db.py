"""Connection pool and the named-query loader."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, LiteralString, Protocol, TypeVar, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from persistence import metrics
from persistence.settings import Settings, get_settings, reveal

_HERE = Path(__file__).parent

Connection = psycopg.AsyncConnection[dict[str, Any]]
# What a statement raises when the database fails or refuses it: the layers above tell it apart from
# their own errors (a Run that met one is recovered, not failed) without importing the driver.
DatabaseError = psycopg.Error
# Lost a row lock to another transaction: a deadlock, or the lock_timeout passed.
LockConflict = (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable)
T = TypeVar("T")
# Attempts of a transaction PostgreSQL aborted to break a deadlock (``retrying_deadlocks``).
DEADLOCK_ATTEMPTS = 5
# The largest bigint (ids, event cursors, offsets): a larger value fails its statement.
MAX_BIGINT = 2**63 - 1


class Deferred(Protocol):
    """Writes a ``Database.tx`` block runs last, just before its commit, gathered as it goes, and
    what follows once it has committed."""

    async def run(self, conn: Connection) -> None: ...

    def committed(self) -> None:
        """After the commit (counts, log lines): never for a transaction that did not commit."""
        ...

    def mark(self) -> int:
        """How much it holds now (for ``undo``)."""
        ...

    def undo(self, mark: int) -> None:
        """Forget what was added after ``mark`` (a savepoint that held it rolled back)."""
        ...


# What each ``Database.tx`` block queued to run last, just before its commit.
_last_statements: weakref.WeakKeyDictionary[Connection, list[Deferred]] = weakref.WeakKeyDictionary()


def queued_last(conn: Connection) -> list[Deferred] | None:
    """The writes the ``Database.tx`` block ``conn`` is in runs at its end, right before the
    commit, in order (callers append to it); None when ``conn`` is in no such block (then the
    caller writes at once). For writes that take a hot lock (the event cursor): taken last, the
    lock is held only for the commit, not for the whole transaction."""
    return _last_statements.get(conn)


@contextlib.asynccontextmanager
async def savepoint(conn: Connection) -> AsyncIterator[None]:
    """A savepoint inside a ``Database.tx`` block: if the block raises, everything it did is undone,
    including what it queued to run at the commit (see ``queued_last``)."""
    queued = _last_statements.get(conn)
    count = len(queued) if queued is not None else 0
    marks = [(item, item.mark()) for item in queued] if queued is not None else []
    try:
        async with conn.transaction():
            yield
    except BaseException:
        if queued is not None:
            del queued[count:]
            for item, mark in marks:
                item.undo(mark)
        raise


def resolve_database_url(settings: Settings | None = None) -> str:
    """The configured URL, or the embedded server's (started on demand, never for a process of a
    Ray cluster of several nodes: ``require_one_node``)."""
    settings = settings or get_settings()
    configured = reveal(settings.database_url)
    if configured:
        return configured
    # Imported here: a Canopy worker is always given the URL, and need not carry the embedded server's package.
    from persistence.embedded import embedded_url, require_one_node

    require_one_node(settings.ray_address)
    return embedded_url(settings.data_dir)


@functools.cache
def query(name: str) -> LiteralString:
    """A named query from ``persistence/queries/<name>.sql`` (read once)."""
    return cast(LiteralString, (_HERE / "queries" / f"{name}.sql").read_text())


def lock_name(*parts: object) -> str:
    """The name of the advisory lock of ``parts``: a JSON array, so that parts holding any text (a
    scope's user and app ids) name one lock each. Joined by a separator, the scopes ("a:b", "c")
    and ("a", "b:c") shared one, and waited for each other's creates."""
    return json.dumps([str(part) for part in parts])


async def advisory_lock(conn: Connection, *parts: object) -> None:
    """Take the transaction-scoped advisory lock of ``parts`` (``lock_name``), released at commit or
    rollback.

    For counts that must not be overshot by concurrent writers: take it, then count, then write;
    the count is a statement of its own (see the query's comment)."""
    await conn.execute(query("advisory_lock"), {"key": lock_name(*parts)})


async def retrying_deadlocks(transaction: Callable[[], Awaitable[T]]) -> T:
    """``transaction`` (a whole one) done again when PostgreSQL aborted it to break a deadlock: the
    other transaction then goes on, so the next attempt gets through once it has committed. For an
    operation that locks many rows in its own order while sessions' steps lock theirs in another
    (Stop all, trees.stop_tree), and must not fail because a member was busy."""
    attempt = 1
    while True:
        try:
            return await transaction()
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_ATTEMPTS:
                raise
        await asyncio.sleep(0.05 * attempt)
        attempt += 1


# SQLSTATEs of a server that is going away, starting, or full: a connection exception (class 08), an
# administrator's or a crash's shutdown, a server not yet accepting connections, too many clients.
_UNAVAILABLE_STATES = ("57P01", "57P02", "57P03", "53300")


def database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot be reached or is not serving (a restart, a failover,
    no connection free in the pool), not that a statement failed: a statement timeout, a limit the
    server enforces, a disk full would fail the same way when sent again."""
    if isinstance(error, PoolTimeout | PoolClosed):
        return True
    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _UNAVAILABLE_STATES


async def ping(conn: psycopg.AsyncConnection[Any]) -> None:
    """A round trip to the database (on any connection: a pool's, or a listener's); raises when it
    does not answer."""
    await conn.execute(query("ping"))


def session_options(settings: Settings) -> str:
    """libpq ``options`` bounding every pooled session: a runaway statement, a lock wait and a
    transaction left open end with an error instead of holding a connection (and its locks)
    forever. Values in milliseconds."""
    bounds = {"statement_timeout": settings.db_statement_timeout_seconds,
              "lock_timeout": settings.db_lock_timeout_seconds,
              "idle_in_transaction_session_timeout": settings.db_idle_in_transaction_seconds}
    return " ".join(f"-c {name}={milliseconds(seconds)}" for name, seconds in bounds.items())


def milliseconds(seconds: float) -> int:
    """A PostgreSQL timeout setting's value (int milliseconds; 0 would mean none)."""
    return max(1, round(seconds * 1000))


# libpq's TCP bounds: a connection whose server vanished without a reset (its machine lost, a network
# partition) is found dead in about 25 s of silence or 30 s of unacknowledged data, not after Linux's
# two hours before a first keepalive. Until then a statement on it waits for ever (statement_timeout
# is the server's to enforce), and so do the process's lease renewals behind it. Unix sockets ignore them.
_TCP_BOUNDS = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3",
               "tcp_user_timeout": "30000"}


def tcp_bounds(url: str) -> dict[str, str]:
    """The TCP bounds for a connection to ``url``, each unless the URL sets it."""
    given = conninfo_to_dict(url)
    return {name: value for name, value in _TCP_BOUNDS.items() if name not in given}


# How long one attempt of the pool to replace a lost connection goes on (psycopg_pool's default is
# 5 minutes) before the pool gives it up and begins the next (_connect_again). An attempt waits
# twice as long after each failure, so the pool's next try came up to half an outage after the
# database was back (26 s after 40 s down): bounded, the next comes within a few seconds.
RECONNECT_SECONDS = 10.0
# How long a transaction waits for a connection of its process's pool (psycopg_pool's default): a
# Run rides out a database restart this long before its step fails and the Run is recovered.
WAIT_SECONDS = 30.0


async def _connect_again(pool: AsyncConnectionPool) -> None:
    """An attempt to reconnect was given up. psycopg_pool begins another only when a new request
    finds the pool empty: the transactions already waiting for a connection (each up to
    WAIT_SECONDS) waited out their whole wait though the server was back. ``check`` begins one at
    once (its growing the pool when it has room and none is under way; tests/persistence/test_db.py
    fails without it). Only for waiting transactions: an idle pool tried again all outage long (one
    attempt every two seconds, each a warning, and a backend for a server that refuses clients), and
    waiters mean no idle connection, so ``check`` tests none (a test of a dead one may hang)."""
    if not pool.closed and pool.get_stats().get("requests_waiting", 0):
        await pool.check()


async def open_pool(url: str, max_size: int | None = None, min_size: int = 1,
                    settings: Settings | None = None, wait_seconds: float = WAIT_SECONDS) -> AsyncConnectionPool:
    settings = settings or get_settings()
    given = conninfo_to_dict(url)
    pool = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size or settings.db_pool_max,
        timeout=wait_seconds,
        reconnect_timeout=RECONNECT_SECONDS,
        reconnect_failed=_connect_again,
        # After any options the URL carries, so that these bounds win (a later -c overrides).
        kwargs={"row_factory": dict_row, "autocommit": False, "prepare_threshold": 0,
                "options": " ".join(filter(None, [given.get("options"), session_options(settings)])),
                # Which process holds a connection (pg_stat_activity), unless the URL names it.
                "application_name": given.get("application_name") or f"canopy-{os.getpid()}",
                **tcp_bounds(url)},
        open=False,
    )
    await pool.open(wait=True)
    return pool


class Database:
    """A pool plus the one way to use it: ``async with db.tx() as conn`` is one transaction."""

    def __init__(self, pool: AsyncConnectionPool, *, carries_metrics: bool = True) -> None:
        self.pool = pool
        # Whether this process's metric counts are flushed through this pool after its commits. Not
        # a pool kept apart from the process's work (lease renewals): a flush upserts rows every
        # process shares, and may wait on another process's flush.
        self.carries_metrics = carries_metrics

    @classmethod
    async def connect(cls, url: str | None = None, max_size: int | None = None, min_size: int = 1,
                      settings: Settings | None = None, wait_seconds: float = WAIT_SECONDS,
                      carries_metrics: bool = True) -> Database:
        return cls(await open_pool(url or resolve_database_url(settings), max_size=max_size, min_size=min_size,
                                   settings=settings, wait_seconds=wait_seconds), carries_metrics=carries_metrics)

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[Connection]:
        async with self.pool.connection() as conn:
            connection = cast(Connection, conn)
            async with conn.transaction():
                queued = _last_statements[connection] = []
                try:
                    yield connection
                finally:
                    del _last_statements[connection]
                for deferred in queued:  # only when the block succeeded: a failed one rolls back
                    await deferred.run(connection)
            for deferred in queued:  # the commit succeeded too
                deferred.committed()
        if self.carries_metrics:  # after the commit: this process's counts reach the table within a second
            metrics.flush_soon(self)

    async def close(self) -> None:
        # A process that stops (a passivating session actor, a host, the sweeper) closes its pool
        # last: its counts not yet flushed would otherwise die with it.
        if self.carries_metrics:
            await metrics.flush_and_forget(self)
        await self.pool.close()


class LazyDatabase:
    """A pool opened on first use — once, however many callers ask for it at the same time (an
    actor's first calls arrive together) — and closed with ``close``."""

    def __init__(self, url: str | None = None, *, max_size: int | None = None, min_size: int = 1,
                 carries_metrics: bool = True) -> None:
        self._options = {"url": url, "max_size": max_size, "min_size": min_size, "carries_metrics": carries_metrics}
        self._db: Database | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Database:
        if self._db is None:
            async with self._lock:
                if self._db is None:
                    self._db = await Database.connect(**self._options)  # type: ignore[arg-type]
        return self._db

    @property
    def opened(self) -> Database | None:
        return self._db

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
