"""The pool: opened once on first use however many ask at once, and bounding every session: a runaway
statement is cancelled, a lock wait gives up, and a transaction left open loses its connection,
each with PostgreSQL's own clear error."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from persistence import db as db_module
from persistence import migrations
from persistence.db import Database, LazyDatabase
from persistence.embedded import embedded_url, running_postmaster, stop_embedded
from persistence.settings import Settings
from tests.persistence.helpers import tcp_link

BOUNDS = Settings(db_statement_timeout_seconds=0.5, db_lock_timeout_seconds=0.3, db_idle_in_transaction_seconds=0.5)


@pytest.fixture
async def bounded(database_url: str) -> AsyncIterator[Database]:
    database = await Database.connect(database_url, max_size=2, settings=BOUNDS)
    yield database
    await database.close()


async def _backend_alive(db: Database, pid: int) -> bool:
    async with db.tx() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s", (pid,))
        row = await cur.fetchone()
    return bool(row and row["n"])


async def test_pooled_sessions_carry_the_configured_bounds(bounded: Database, db: Database) -> None:
    async with bounded.tx() as conn:
        cur = await conn.execute("SELECT current_setting('statement_timeout') AS statement, "
                                 "current_setting('lock_timeout') AS lock, "
                                 "current_setting('idle_in_transaction_session_timeout') AS idle")
        assert await cur.fetchone() == {"statement": "500ms", "lock": "300ms", "idle": "500ms"}
    async with db.tx() as conn:  # the defaults, from Settings
        cur = await conn.execute("SELECT current_setting('statement_timeout') AS statement")
        assert await cur.fetchone() == {"statement": "1min"}


async def test_a_statement_beyond_the_bound_is_cancelled(bounded: Database) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        async with bounded.tx() as conn:
            await conn.execute("SELECT pg_sleep(5)")
    async with bounded.tx() as conn:  # the pool goes on serving
        assert await (await conn.execute("SELECT 1 AS one")).fetchone() == {"one": 1}


async def test_a_lock_wait_beyond_the_bound_gives_up(bounded: Database, db: Database) -> None:
    async with db.tx() as holder:
        await holder.execute("CREATE TEMP TABLE held (id int)")  # temp: private to this session
        await holder.execute("SELECT pg_advisory_xact_lock(4242)")
        with pytest.raises(psycopg.errors.LockNotAvailable, match="lock timeout"):
            async with bounded.tx() as conn:
                await conn.execute("SELECT pg_advisory_xact_lock(4242)")


async def test_a_transaction_left_idle_beyond_the_bound_loses_its_connection(bounded: Database,
                                                                              db: Database) -> None:
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout, match="idle-in-transaction timeout"):
        async with bounded.tx() as conn:
            pid = (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]
            await asyncio.sleep(1.5)  # inside the transaction, doing nothing
            await conn.execute("SELECT 1")
    assert not await _backend_alive(db, pid)


async def test_concurrent_first_uses_open_one_pool(database_url: str) -> None:
    lazy = LazyDatabase(database_url, max_size=2)
    try:
        opened = await asyncio.gather(*(lazy.get() for _ in range(10)))
        assert len({id(db) for db in opened}) == 1
        async with opened[0].tx() as conn:
            cur = await conn.execute("SELECT 1 AS one")
            assert await cur.fetchone() == {"one": 1}
    finally:
        await lazy.close()


def _until_stopped(data_dir: Path) -> None:
    while running_postmaster(data_dir) is not None:
        time.sleep(0.1)


async def _select_one(database: Database) -> int:
    async with database.tx() as conn:
        cur = await conn.execute("SELECT 1 AS one")
        row = await cur.fetchone()
    assert row is not None
    return int(row["one"])


async def test_a_transaction_waiting_for_a_connection_gets_one_once_the_server_is_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg_pool gives an attempt to reconnect up after ``reconnect_timeout`` and begins another
    only when a new request finds the pool empty: a transaction already waiting waited out its whole
    wait (a Run's 30 s: a tree went on ~20 s after a 15 s outage) though the server was back. Here
    the server, crashed, is back after the pool gave its attempt up, well within the wait."""
    monkeypatch.setattr(db_module, "RECONNECT_SECONDS", 1.0)
    data_dir = Path(tempfile.mkdtemp(prefix="cdb-", dir="/tmp"))  # short: the server's socket is in it
    try:
        database = await Database.connect(embedded_url(data_dir), max_size=1, wait_seconds=15)
        try:
            postmaster = running_postmaster(data_dir)
            assert postmaster is not None and await _select_one(database) == 1
            os.kill(postmaster, signal.SIGQUIT)  # an immediate shutdown: the pooled connection is cut
            await asyncio.to_thread(_until_stopped, data_dir)
            with contextlib.suppress(psycopg.OperationalError):  # the connection it held, cut
                await _select_one(database)
            waiting = asyncio.create_task(_select_one(database))
            await asyncio.sleep(3)  # the pool tried and gave up (after 1 s)
            assert not waiting.done()
            await asyncio.to_thread(embedded_url, data_dir)  # the server is back
            assert await asyncio.wait_for(waiting, timeout=10) == 1  # was a PoolTimeout at 15 s
        finally:
            await database.close()
    finally:
        stop_embedded(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _tcp_options(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """The kernel's TCP keepalive and user-timeout settings of a connection's socket."""
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        return {"keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)}


def _schema_connection_idle(url: str) -> int:
    """The keepalive idle of the connection a start checks and migrates the schema on."""
    with migrations.connect(url) as conn:
        return _tcp_options(conn)["idle"]


async def test_a_pooled_tcp_connection_finds_a_vanished_server_in_seconds_not_hours(database_url: str) -> None:
    """A server gone without a reset (its machine lost) left a statement, and the process's lease
    renewals behind it, waiting until the kernel's first keepalive two hours on: each pooled TCP
    connection probes after 10 s of silence, as does the start's own. A URL's own settings win."""
    async with tcp_link(database_url) as (tcp_url, _):
        for url, idle in ((tcp_url, 10), (make_conninfo(tcp_url, keepalives_idle="60"), 60)):
            database = await Database.connect(url, max_size=1)
            try:
                async with database.pool.connection() as conn:
                    assert _tcp_options(conn) == {"keepalive": 1, "idle": idle, "interval": 5, "count": 3,
                                                  "user_timeout_ms": 30_000}
                    assert await (await conn.execute("SELECT 1 AS one")).fetchone() == {"one": 1}
            finally:
                await database.close()
        assert await asyncio.to_thread(_schema_connection_idle, tcp_url) == 10
