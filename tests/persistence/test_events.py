"""Event cursors: one sequence per scope, and a reader never sees cursor N+1 before N."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid

from persistence import events
from persistence.db import Database, savepoint
from persistence.records import Scope
from persistence.scopes import ensure_scope
from tests.persistence.helpers import (
    PLANNED_AT_SCALE,
    ExplainingConnection,
    fetch_all,
    indexes_read,
    rows_read,
    start_root_run,
)


async def read_after(db: Database, scope: Scope, after: int) -> list[int]:
    async with db.tx() as conn:
        return [row["cursor"] for row in await events.events_after(conn, scope, after)]


async def append(db: Database, scope: Scope, kind: str, hold: float = 0.0) -> int:
    """Append one event in its own transaction (held open ``hold`` s); its cursor, read back."""
    async with db.tx() as conn:
        await events.append_event(conn, scope, kind, payload={"kind": kind})
        await asyncio.sleep(hold)
    async with db.tx() as conn:
        return max(row["cursor"] for row in await events.events_after(conn, scope, 0) if row["kind"] == kind)


async def test_a_transaction_takes_the_cursor_at_its_end_not_when_it_appends(db: Database, scope: Scope) -> None:
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
    async with db.tx() as first:
        await events.append_event(first, scope, "early")
        # Another writer of the scope is not held up by this open transaction's event.
        late = await asyncio.wait_for(append(db, scope, "late"), timeout=5)
        assert await read_after(db, scope, 0) == [late]
    committed = await read_after(db, scope, 0)
    async with db.tx() as conn:
        kinds = [row["kind"] for row in await events.events_after(conn, scope, 0)]
    assert committed == [1, 2] and kinds == ["late", "early"]  # cursor order is commit order


async def test_a_held_appender_blocks_the_next_and_readers_see_commit_order(db: Database, scope: Scope) -> None:
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
    # Outside ``Database.tx`` an event is written at once, so this transaction holds the
    # scope's counter from here on: what every transaction does for its commit.
    async with db.pool.connection() as first, first.transaction():
        await events.append_event(first, scope, "one")  # type: ignore[arg-type]
        second = asyncio.create_task(append(db, scope, "two"))
        await asyncio.sleep(0.3)
        assert not second.done()  # its commit waits for the scope's counter
        assert await read_after(db, scope, 0) == []  # neither is visible
    assert await second == 2
    assert await read_after(db, scope, 0) == [1, 2]


async def test_cursors_are_per_scope(db: Database, scope: Scope) -> None:
    other = Scope(scope.user_id, scope.app_id + "-other")
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
        await ensure_scope(conn, other)
    mine = [await append(db, scope, f"a{i}") for i in range(3)]
    theirs = [await append(db, other, f"b{i}") for i in range(2)]
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
    assert [e["kind"] for e in mine] == ["session_created", "input_received", "turn_started", "run_started"]
    assert [e["cursor"] for e in by_session] == [e["cursor"] for e in mine]
    assert {e["tree_id"] for e in everything} == {tree.tree_id, other.tree_id}
    started = next(e for e in mine if e["kind"] == "turn_started")
    granted = next(e for e in mine if e["kind"] == "run_started")
    assert (started["turn_id"], started["run_id"]) == (run.turn_id, run.run_id)
    assert (granted["turn_id"], granted["run_id"]) == (run.turn_id, run.run_id)  # its slot was granted


async def test_one_transactions_events_are_written_together_in_order_per_scope(db: Database, scope: Scope) -> None:
    other = Scope(scope.user_id + "-other", scope.app_id)
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
        await ensure_scope(conn, other)
    async with db.tx() as conn:
        for n in range(3):
            await events.append_event(conn, scope, f"mine-{n}", payload={"n": n})
            await events.append_event(conn, other, f"theirs-{n}")
    with contextlib.suppress(RuntimeError):
        async with db.tx() as conn:  # a rolled-back transaction appends nothing
            await events.append_event(conn, scope, "rolled-back")
            raise RuntimeError("abort")
    async with db.tx() as conn:
        mine = await events.events_after(conn, scope, 0)
        theirs = await events.events_after(conn, other, 0)
    assert [(e["cursor"], e["kind"], e["payload"]) for e in mine] == [
        (1, "mine-0", {"n": 0}), (2, "mine-1", {"n": 1}), (3, "mine-2", {"n": 2})]
    assert [(e["cursor"], e["kind"]) for e in theirs] == [(1, "theirs-0"), (2, "theirs-1"), (3, "theirs-2")]


async def test_events_of_a_rolled_back_savepoint_are_not_written(db: Database, scope: Scope) -> None:
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
    async with db.tx() as conn:
        await events.append_event(conn, scope, "kept-before")
        with contextlib.suppress(RuntimeError):
            async with savepoint(conn):
                await events.append_event(conn, scope, "undone")
                raise RuntimeError("the savepoint's work is refused")
        await events.append_event(conn, scope, "kept-after")
    async with db.tx() as conn:
        kinds = [row["kind"] for row in await events.events_after(conn, scope, 0)]
    assert kinds == ["kept-before", "kept-after"]


async def test_a_page_of_events_is_bounded_by_its_payloads_bytes(db: Database, scope: Scope) -> None:
    """A human wait's event holds what it asks whole (up to 100,000 characters): a stream's read of
    500 such events held 50 MB. A page ends once it holds the bytes asked for (its first event
    always comes), and says that more follow."""
    async with db.tx() as conn:
        await ensure_scope(conn, scope)
        for n in range(5):
            await events.append_event(conn, scope, "waiting_approval", payload={"command": str(n) * 1_000_000})
    pages, after, more = [], 0, True
    while more:
        async with db.tx() as conn:
            rows, more = await events.events_page(conn, scope, after, limit=500, max_bytes=2_500_000)
        pages.append([row["payload"]["command"][0] for row in rows])
        after = rows[-1]["cursor"]
    assert pages == [["0", "1", "2"], ["3", "4"]]
    async with db.tx() as conn:  # a limit of one byte still gives one event a page
        assert [row["cursor"] for row in (await events.events_page(conn, scope, 0, max_bytes=1))[0]] == [1]


async def test_a_wait_reads_its_targets_updates_not_their_other_events(db: Database, scope: Scope) -> None:
    """wait_sessions's check (at each call, and each sweep round for every open sessions wait) read
    every event of its targets after the wait's cursor, their messages and Runs too: a target busy
    with a long Turn was read again, whole, every 2 s. It reads the updates alone."""
    tree, _run = await start_root_run(db, scope)
    async with db.tx() as conn:
        after = max((row["cursor"] for row in await events.events_after(conn, scope, 0)), default=0)
        for _ in range(300):
            await events.append_event(conn, scope, "message", session_id=tree.root_id, tree_id=tree.tree_id)
    async with db.tx() as conn:
        await conn.execute("ANALYZE events")
        await conn.execute(PLANNED_AT_SCALE)
        explaining = ExplainingConnection(conn)
        found = await events.session_updates_after(explaining, scope, uuid.uuid4(), [tree.root_id],  # type: ignore[arg-type]
                                                   after)
        index = await (await conn.execute("SELECT indexdef FROM pg_indexes "
                                          "WHERE indexname = 'events_session_updates'")).fetchone()
    assert found == []
    assert rows_read(explaining.plans[-1], "events") == 0, indexes_read(explaining.plans[-1], "events")
    assert index is not None and all(f"'{kind}'" in index["indexdef"] for kind in events.SESSION_UPDATE_KINDS)
