"""Event cursors: one sequence per scope, and a reader never sees cursor N+1 before N."""

from __future__ import annotations

import asyncio
import random

from persistence import events
from persistence.db import Database
from persistence.records import Row, Scope
from persistence.scopes import ensure_scope
from tests.persistence.helpers import fetch_all, start_root_run


async def read_after(db: Database, scope: Scope, after: int) -> list[int]:
    async with db.tx() as conn:
        return [row["cursor"] for row in await events.events_after(conn, scope, after)]


async def append(db: Database, scope: Scope, kind: str, hold: float = 0.0) -> Row:
    async with db.tx() as conn:
        event = await events.append_event(conn, scope, kind, payload={"kind": kind})
        await asyncio.sleep(hold)
        return event


async def test_a_held_appender_blocks_the_next_and_readers_see_commit_order(db: Database, scope: Scope) -> None:
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
    async with db.tx() as first:
        one = await events.append_event(first, scope, "one")
        second = asyncio.create_task(append(db, scope, "two", hold=0.3))
        await asyncio.sleep(0.3)
        assert not second.done()  # blocked on the scope's counter
        assert await read_after(db, scope, 0) == []  # neither is visible
    await asyncio.sleep(0.1)
    assert await read_after(db, scope, 0) == [one["cursor"]]  # the second is still open
    two = await second
    assert two["cursor"] == one["cursor"] + 1
    assert await read_after(db, scope, 0) == [one["cursor"], two["cursor"]]


async def test_cursors_are_per_scope(db: Database, scope: Scope) -> None:
    other = Scope(scope.user_id, scope.app_id + "-other")
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
        await ensure_scope(conn, other)
    mine = [(await append(db, scope, "a"))["cursor"] for _ in range(3)]
    theirs = [(await append(db, other, "b"))["cursor"] for _ in range(2)]
    assert mine == [1, 2, 3] and theirs == [1, 2]
    assert await read_after(db, other, 0) == [1, 2]


async def test_many_concurrent_appenders_and_a_polling_reader(db: Database, scope: Scope) -> None:
    appenders, per_appender = 6, 25
    total = appenders * per_appender
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
    rng = random.Random(11)
    seen: list[int] = []

    async def appender(n: int) -> None:
        for i in range(per_appender):
            await append(db, scope, f"a{n}-{i}", hold=rng.random() / 500)

    async def reader() -> None:
        while len(seen) < total:
            batch = await read_after(db, scope, seen[-1] if seen else 0)
            expected_start = (seen[-1] if seen else 0) + 1
            assert batch == list(range(expected_start, expected_start + len(batch)))  # no gap, no reorder
            seen.extend(batch)
            await asyncio.sleep(0)

    # The pool has 8 connections: 6 appenders and one reader fit.
    await asyncio.wait_for(asyncio.gather(reader(), *(appender(n) for n in range(appenders))), timeout=120)
    assert seen == list(range(1, total + 1))
    rows = await fetch_all(db, "SELECT count(*) AS n, max(cursor) AS top FROM events WHERE user_id = %s "
                               "AND app_id = %s", (scope.user_id, scope.app_id))
    assert rows == [{"n": total, "top": total}]


async def test_events_filter_by_session_and_tree(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    other, _ = await start_root_run(db, scope)
    async with db.tx() as conn:
        mine = await events.events_after(conn, scope, 0, tree_id=tree.tree_id)
        by_session = await events.events_after(conn, scope, 0, session_id=tree.root_id)
        everything = await events.events_after(conn, scope, 0)
    assert {e["tree_id"] for e in mine} == {tree.tree_id}
    assert [e["kind"] for e in mine] == ["session_created", "input_received", "turn_started"]
    assert [e["cursor"] for e in by_session] == [e["cursor"] for e in mine]
    assert {e["tree_id"] for e in everything} == {tree.tree_id, other.tree_id}
    started = next(e for e in mine if e["kind"] == "turn_started")
    assert (started["turn_id"], started["run_id"]) == (run.turn_id, run.run_id)
