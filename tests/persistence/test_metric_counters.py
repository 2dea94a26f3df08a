"""The durable counters: a process's counts reach their rows together, a change that rolls back is not
counted, and a scrape's reads hold whatever the process counted."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest

from persistence import metrics
from persistence.databases import rows
from persistence.db import Database, savepoint
from persistence.events import append_event
from persistence.records import Scope
from tests.persistence.helpers import until_a_lock_is_awaited


async def _value(db: Database, name: str, labels: dict[str, str]) -> float | None:
    found = await rows(db, "SELECT value FROM metric_counters WHERE name = %s AND labels = %s::jsonb",
                       name, json.dumps(labels))
    return float(found[0]["value"]) if found else None


def _labels() -> dict[str, str]:
    """Labels of this test's own (its values are no tool's: the rows are the test's alone)."""
    return {"tool": f"test-{uuid.uuid4().hex[:8]}", "outcome": "ok"}


async def test_counts_are_added_together_within_a_second(db: Database) -> None:
    labels = _labels()
    for _ in range(250):
        metrics.add(metrics.TOOL_CALLS, **labels)
    metrics.observe(metrics.SLOT_WAIT, 0.02)
    async with db.tx() as conn:  # a commit schedules the process's flush
        await conn.execute("SELECT 1")

    async def added() -> float | None:
        return await _value(db, "canopy_tool_calls", labels)

    deadline = asyncio.get_running_loop().time() + 10
    while await added() is None:
        assert asyncio.get_running_loop().time() < deadline, "the counts never reached the table"
        await asyncio.sleep(0.1)
    assert await added() == 250  # one row, the whole sum
    async with db.tx() as conn:
        figures = await metrics.read(conn)
    read = [row for row in figures.counters if row["name"] == "canopy_tool_calls" and row["labels"] == labels]
    assert [row["value"] for row in read] == [250]
    assert any(row["name"] == "canopy_slot_wait_seconds_bucket" and row["labels"] == {"le": "0.025"}
               for row in figures.counters)


async def test_a_change_rolled_back_is_not_counted(db: Database) -> None:
    committed, rolled_back, in_savepoint = _labels(), _labels(), _labels()
    with pytest.raises(RuntimeError):
        async with db.tx() as conn:
            metrics.count_at_commit(conn, metrics.TOOL_CALLS, **rolled_back)
            raise RuntimeError("the transaction fails")
    async with db.tx() as conn:
        metrics.count_at_commit(conn, metrics.TOOL_CALLS, **committed)
        with pytest.raises(RuntimeError):
            async with savepoint(conn):
                metrics.count_at_commit(conn, metrics.TOOL_CALLS, **in_savepoint)
                raise RuntimeError("the savepoint rolls back")
    await metrics.flush(db)
    assert await _value(db, "canopy_tool_calls", committed) == 1
    assert await _value(db, "canopy_tool_calls", rolled_back) is None
    assert await _value(db, "canopy_tool_calls", in_savepoint) is None


async def test_a_transaction_that_fails_at_its_end_counts_nothing(db: Database) -> None:
    """Counts were recorded as the block's last writes ran, before its commit: a transaction whose
    last write (its events) failed was counted all the same, and again when its change was made anew."""
    labels = _labels()
    with pytest.raises(AssertionError, match="scope row missing"):
        async with db.tx() as conn:
            metrics.count_at_commit(conn, metrics.TOOL_CALLS, **labels)
            await append_event(conn, Scope(f"nobody-{uuid.uuid4().hex[:8]}", "nowhere"), "turn_started")
    await metrics.flush(db)
    assert await _value(db, "canopy_tool_calls", labels) is None


def test_labels_must_be_the_metrics_own() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        metrics.add(metrics.TOOL_CALLS, tool="x")
    with pytest.raises(ValueError, match="is a gauge"):
        metrics.add(metrics.SLOTS_IN_USE)


def test_model_labels_stay_bounded() -> None:
    labels = metrics.ModelLabels("default-model")
    labels.seed(["seen-before"])
    given = [labels.label(f"model-{i}") for i in range(metrics.MAX_MODEL_LABELS + 10)]
    assert labels.label("default-model") == "default-model" and labels.label("seen-before") == "seen-before"
    assert len(set(given)) == metrics.MAX_MODEL_LABELS  # the first ones (one place went to seen-before)...
    assert given[-1] == metrics.OTHER  # ...then other


def test_no_new_model_label_before_those_already_counted_are_read() -> None:
    # A gateway whose first flush found the database down gave new models labels at once: each such
    # process added its own, and the models counted before lost theirs.
    labels = metrics.ModelLabels("default-model")
    assert labels.label("brand-new") == metrics.OTHER and labels.label("default-model") == "default-model"
    assert labels.label("operators", own={"operators"}) == "operators"
    labels.seed([f"counted-{i}" for i in range(metrics.MAX_MODEL_LABELS)])
    assert labels.label("counted-0") == "counted-0" and labels.label("brand-new") == metrics.OTHER


async def test_a_closing_database_adds_the_counts_not_yet_flushed(db: Database, database_url: str) -> None:
    """A process that stops (a passivating session actor) closes its pool within the flush delay:
    its counts reach the table then, not never."""
    labels = _labels()
    stopping = await Database.connect(database_url, max_size=1)
    metrics.add(metrics.TOOL_CALLS, amount=3, **labels)
    await stopping.close()  # no commit scheduled a flush, and less than FLUSH_SECONDS passed
    assert await _value(db, "canopy_tool_calls", labels) == 3.0


async def test_counts_reach_the_table_after_the_pool_that_scheduled_a_flush_closed(
        db: Database, database_url: str) -> None:
    """A session host's hosted sessions each open a pool and close it when they passivate, while
    the process's counts are one buffer: a flush scheduled by a pool that closed meanwhile must
    use a pool still open, not retry on the closed one while later counts pile up behind it."""
    closing = await Database.connect(database_url, max_size=1)
    async with closing.tx() as conn:
        metrics.add(metrics.TOOL_CALLS, **_labels())
        await conn.execute("SELECT 1")  # schedules the flush with this pool
    await closing.pool.close()  # closed before the flush runs (not through close(), which flushes)
    labels = _labels()
    metrics.add(metrics.TOOL_CALLS, amount=2, **labels)
    async with db.tx() as conn:  # another pool of the same process commits
        await conn.execute("SELECT 1")

    deadline = asyncio.get_running_loop().time() + 10
    while await _value(db, "canopy_tool_calls", labels) != 2.0:
        assert asyncio.get_running_loop().time() < deadline, "the counts never reached the table"
        await asyncio.sleep(0.1)


async def test_a_count_made_after_the_last_commit_reaches_the_table(db: Database, database_url: str) -> None:
    """A sandbox host counts a command once its receipt is committed, and may commit nothing
    more for a long time: the count must not wait for a next commit."""
    async with db.tx() as conn:
        await conn.execute("SELECT 1")
    labels = _labels()
    metrics.add(metrics.TOOL_CALLS, amount=4, **labels)  # no commit after it

    async def value() -> float | None:  # read outside Database.tx, whose commit would schedule a flush
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT value FROM metric_counters WHERE name = %s AND labels = %s::jsonb",
                                     ("canopy_tool_calls", json.dumps(labels)))
            found = await cur.fetchone()
        return float(found[0]) if found else None

    deadline = asyncio.get_running_loop().time() + 10
    while await value() != 4.0:
        assert asyncio.get_running_loop().time() < deadline, "the count waited for a commit that never came"
        await asyncio.sleep(0.2)


async def test_a_flush_asked_while_another_commits_returns_once_the_counts_are_in(db: Database) -> None:
    """A closing pool flushes what is pending, and a test (or a scrape) then reads the table: a flush
    under way had taken the counts, so the closing one found nothing and returned before they were
    committed (the gateway's model-call counts, read as 0 on a slow CI run)."""
    labels = _labels()
    async with db.tx() as locker:
        await locker.execute("LOCK TABLE metric_counters IN EXCLUSIVE MODE")  # the first flush waits on it
        # Counted once the table is locked, and taken by the first flush in the same step of the loop:
        # counted before, the flush a count schedules (1 s on) could commit it first on a slow run,
        # or into another test's database, leaving the first flush nothing to wait with.
        metrics.add(metrics.TOOL_CALLS, **labels)
        first = asyncio.create_task(metrics.flush(db))
        await until_a_lock_is_awaited(db, "metric_counters")
        second = asyncio.create_task(metrics.flush(db))
        for _ in range(10):  # every step it can take without the first flush's commit
            await asyncio.sleep(0)
        assert not second.done()
    assert await second and await first
    assert await _value(db, "canopy_tool_calls", labels) == 1.0
