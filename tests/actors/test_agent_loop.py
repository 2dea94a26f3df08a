"""A reply's tool calls get ids unique within their Turn, in time linear in the calls: a hostile
reply of thousands of calls with one id must not hold the session host's event loop (which serves
every session of the host) for the square of that. A cooperation call that deadlocks with another
session's step is a clear refusal."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from actors.agent_loop import _in_savepoint, _with_unique_ids
from actors.tools import Tool, ToolArgs
from persistence.db import Connection, Database, advisory_lock, lock_name
from persistence.errors import Conflict, Deadlock


class _CountedSet(set[str]):
    """A set that counts how often it is asked whether it holds an id."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lookups = 0

    def __contains__(self, item: object) -> bool:
        self.lookups += 1
        return super().__contains__(item)


def test_ids_a_reply_repeats_are_made_unique_in_linear_time() -> None:
    calls = [{"id": "call_0", "name": "list_agents", "arguments": {}}] * 3000 + \
        [{"name": "list_agents", "arguments": {}}] * 3000 + [{"id": "call_0_2", "name": "x", "arguments": {}}]
    taken = _CountedSet({"call_0", "call_5"})
    renamed = _with_unique_ids(calls, taken)
    ids = [call["id"] for call in renamed]
    assert len(set(ids)) == len(ids) == len(calls)
    assert not {"call_0", "call_5"} & set(ids)
    assert ids[:3] == ["call_0_2", "call_0_3", "call_0_4"] and ids[3000:3002] == ["call", "call_2"]
    assert ids[-1] == "call_0_2_2"  # its own id was given to the first repeat of call_0
    assert taken.lookups <= 3 * len(calls), taken.lookups


def test_long_ids_that_share_a_stem_are_made_unique_in_linear_time() -> None:
    """Thousands of distinct 64-character ids with one 62-character prefix, each repeated: every
    renamed one took the same cut stem, and each new id searched again through every suffix the
    others had taken (16,384 calls held the event loop for 5.8 s, 65,536 for 45 s)."""
    bases = [f"{'x' * 56}{n:08d}" for n in range(2000)]
    calls = [{"id": base, "name": "list_agents", "arguments": {}} for base in bases for _ in range(2)]
    taken = _CountedSet()
    ids = [call["id"] for call in _with_unique_ids(calls, taken)]
    assert len(set(ids)) == len(ids) == len(calls) and all(len(i) <= 64 for i in ids)
    assert taken.lookups <= 3 * len(calls), taken.lookups


async def test_a_deadlock_with_another_sessions_step_is_a_conflict_that_changes_nothing(db: Database) -> None:
    """Two sessions acting on each other at once: each step holds its own session's lock and waits for
    the other's. The call PostgreSQL picks is refused with a Conflict (it was an internal error with
    the server's details), what it wrote is undone, and its step goes on to commit."""
    first, second = 7_000_000 + uuid.uuid4().int % 1_000_000, 8_000_000 + uuid.uuid4().int % 1_000_000
    marker = f"deadlock-{uuid.uuid4().hex[:8]}"

    async def acts_on_the_other(ctx: Any, conn: Connection, call_id: str, args: Any) -> dict[str, Any]:
        await conn.execute("INSERT INTO scopes (user_id, app_id) VALUES (%s, 'deadlock')", (marker,))
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (second,))
        return {"status": "accepted"}

    tool = Tool("submit_input", "", ToolArgs, acts_on_the_other, acts=True)
    holding = asyncio.Event()

    async def other_step() -> None:
        async with db.tx() as conn:
            await conn.execute("SET LOCAL deadlock_timeout = '20s'")  # the tool's side detects it first
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (second,))
            holding.set()
            await asyncio.sleep(0.5)
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (first,))

    other = asyncio.create_task(other_step())
    async with db.tx() as conn:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (first,))
        await holding.wait()
        with pytest.raises(Conflict, match="call it again"):
            await _in_savepoint(conn, tool, None, "call-1", None)  # type: ignore[arg-type]
        await conn.execute("SELECT 1")  # the step's transaction goes on, and commits
    await asyncio.wait_for(other, 30)  # which let the other step take its lock
    async with db.tx() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM scopes WHERE user_id = %s", (marker,))
        assert await cur.fetchone() == {"n": 0}


async def test_a_refused_wait_holds_no_lock_past_its_call(db: Database) -> None:
    """A wait refused as a deadlock had taken its scope's wait lock, and kept it until its step
    committed: every wait of the user stalled meanwhile, and a session acting on this one could
    deadlock with it. A tool's call runs in a savepoint now, whose rollback lets go of the lock."""
    parts = ("canopy.waits", f"refused-{uuid.uuid4().hex[:8]}", "app")

    async def refused_wait(ctx: Any, conn: Connection, call_id: str, args: Any) -> dict[str, Any]:
        await advisory_lock(conn, *parts)
        raise Deadlock("waiting would deadlock", ["/root", "/root"])

    tool = Tool("wait_inputs", "", ToolArgs, refused_wait)
    async with db.tx() as conn:
        with pytest.raises(Deadlock):
            await _in_savepoint(conn, tool, None, "call-1", None)  # type: ignore[arg-type]
        async with db.tx() as other:  # another step, while this one goes on
            cur = await other.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0)) AS free",
                                      (lock_name(*parts),))
            assert await cur.fetchone() == {"free": True}
