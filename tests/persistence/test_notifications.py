"""Notifications reach a listener when the sending transaction commits, and never before."""

from __future__ import annotations

import asyncio

import psycopg

from persistence import notifications
from persistence.db import Database, ping
from persistence.migrations import connect, server_version


async def _next(listener: psycopg.AsyncConnection, timeout: float) -> psycopg.Notify | None:
    try:
        return await asyncio.wait_for(anext(listener.notifies()), timeout)
    except TimeoutError:
        return None


async def test_a_notification_reaches_its_listener_at_the_commit(db: Database, database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        await notifications.listen(listener, "canopy_test_channel")
        async with db.tx() as conn:
            await notifications.notify(conn, "canopy_test_channel", '{"delta": "hi"}')
            await notifications.notify(conn, "canopy_other_channel", "not for this listener")
            assert await _next(listener, 0.5) is None  # not committed yet
        note = await _next(listener, 10)
        assert note is not None and (note.channel, note.payload) == ("canopy_test_channel", '{"delta": "hi"}')
        assert await _next(listener, 0.5) is None


async def test_ping_and_server_version_answer(db: Database, database_url: str) -> None:
    async with db.tx() as conn:
        await ping(conn)
    with connect(database_url) as conn:
        assert server_version(conn).split(".")[0].isdigit()
