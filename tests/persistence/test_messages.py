"""Cooperation messages and steers: durable, no Input or Turn, read at the receiver's next model boundary."""

from __future__ import annotations

import uuid

import pytest

from persistence import cooperation, ignorable, messages, turns
from persistence.db import Database
from persistence.errors import Conflict, InvalidArgument
from persistence.records import Scope
from tests.persistence.helpers import (
    child_run,
    count_rows,
    create_child,
    fetch_all,
    fetch_one,
    make_tree,
    start_root_run,
)


async def test_a_message_creates_no_input_and_is_read_at_the_next_boundary(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    aaa, aaa_run = await child_run(db, run, "aaa")
    before = await count_rows(db)
    async with db.tx() as conn:
        sent = await cooperation.send_message(conn, run, "m1", target="/root/aaa", text="use the blue one")
    after = await count_rows(db)
    assert after["coop_messages"] == before["coop_messages"] + 1
    assert (after["inputs"], after["turns"], after["runs"]) == (before["inputs"], before["turns"], before["runs"])

    async with db.tx() as conn:
        taken = (await messages.take_boundary(conn, aaa_run)).taken
        assert (await messages.take_boundary(conn, aaa_run)).taken == []  # processed once
        # The rows handed back are the history rows, as a later read finds them.
        assert taken == (await messages.history(conn, aaa_run.session_id))[-1:]
    assert taken[0]["role"] == "user" and "use the blue one" in taken[0]["content"]
    row = await fetch_one(db, "SELECT processed_at, processed_run_id FROM coop_messages WHERE message_id = %s",
                          (uuid.UUID(sent["message_id"]),))
    assert row["processed_at"] is not None and row["processed_run_id"] == aaa_run.run_id
    async with db.tx() as conn:
        history = await messages.history(conn, aaa_run.session_id)
    last = history[-1]
    assert (last["role"], last["run_id"]) == ("user", aaa_run.run_id)
    assert "use the blue one" in last["content"] and 'from="/root"' in last["content"]
    assert last["origin"]["kind"] == "message"
    assert aaa["session_id"] == sent["session_id"]


async def test_an_idle_receiver_keeps_the_message(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    other = await make_tree(db, scope)  # idle: no input, no Turn
    async with db.tx() as conn:
        await cooperation.send_message(conn, run, "m1", target=str(other.root_id), text="for later")
    pending = await fetch_all(db, "SELECT body, processed_at FROM coop_messages WHERE receiver_session_id = %s",
                              (other.root_id,))
    assert pending == [{"body": "for later", "processed_at": None}]
    assert await fetch_all(db, "SELECT 1 FROM turns WHERE session_id = %s", (other.root_id,)) == []
    assert tree.root_id != other.root_id


async def test_message_length_is_limited_with_nothing_stored(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    await create_child(db, run, "aaa")
    before = await count_rows(db)
    with pytest.raises(InvalidArgument, match="limit is 100000"):
        async with db.tx() as conn:
            await cooperation.send_message(conn, run, "m1", target="/root/aaa", text="x" * 100_001)
    assert await count_rows(db) == before
    async with db.tx() as conn:
        await cooperation.send_message(conn, run, "m2", target="/root/aaa", text="x" * 100_000)
    assert (await count_rows(db))["coop_messages"] == before["coop_messages"] + 1


async def test_steer_needs_a_running_turn(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    before = await count_rows(db)
    with pytest.raises(Conflict, match="no running turn"):
        async with db.tx() as conn:
            await messages.steer(conn, scope, tree.root_id, "go left")
    assert await count_rows(db) == before


async def test_steer_reaches_the_running_turn_at_its_boundary(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        steered = await messages.steer(conn, scope, tree.root_id, "go left")
    assert steered["turn_id"] == run.turn_id
    stored = await fetch_one(db, "SELECT kind, sender_session_id, body FROM coop_messages WHERE message_id = %s",
                             (steered["message_id"],))
    assert stored == {"kind": "steer", "sender_session_id": None, "body": "go left"}
    async with db.tx() as conn:
        assert len((await messages.take_boundary(conn, run)).taken) == 1
        history = await messages.history(conn, tree.root_id)
    assert history[-1]["content"] == "<canopy:steer>\ngo left\n</canopy:steer>"


async def test_a_cancelling_turns_boundary_takes_no_message(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        steered = await messages.steer(conn, scope, tree.root_id, "go left")
        assert await turns.cancel_turn(conn, scope, tree.root_id, run.turn_id)  # the live Run must stop
    before = await count_rows(db)
    async with db.tx() as conn:
        boundary = await messages.take_boundary(conn, run)
    assert (boundary.turn_status, boundary.taken) == ("cancelling", [])
    assert await count_rows(db) == before
    row = await fetch_one(db, "SELECT processed_at FROM coop_messages WHERE message_id = %s",
                          (uuid.UUID(str(steered["message_id"])),))
    assert row["processed_at"] is None  # left for whoever reads the session next


async def test_tool_results_are_written_together_in_call_order(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    results = [(f"call-{i}", f'{{"n": {i}}}') for i in (3, 1, 2)]
    async with db.tx() as conn:
        rows = await messages.append_tool_results(conn, run, results)
        assert await messages.append_tool_results(conn, run, []) == []
        # The rows handed back are the history rows, as a later read finds them, in call order.
        assert rows == (await messages.history(conn, run.session_id))[-3:]
    assert [(r["role"], r["tool_call_id"], r["content"]) for r in rows] == [("tool", c, t) for c, t in results]
    events = await fetch_all(db, "SELECT payload FROM events WHERE run_id = %s AND kind = 'message' ORDER BY cursor",
                             (run.run_id,))
    assert [e["payload"]["tool_call_id"] for e in events][-3:] == ["call-3", "call-1", "call-2"]


async def test_history_reads_every_message_of_a_long_session(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:  # 10,050 more messages: past one page of the history read
        await conn.execute(
            "INSERT INTO thread_messages (session_id, turn_id, run_id, role, content) "
            "SELECT %s, %s, %s, 'assistant', 'm' || n FROM generate_series(1, 10050) AS n",
            (tree.root_id, run.turn_id, run.run_id))
        read = await messages.history(conn, tree.root_id)
        limited, more = await messages.reader_page(conn, tree.root_id, after_id=0, limit=3, max_bytes=10**6)
    assert len(read) == 10051  # the input and every reply
    assert read[-1]["content"] == "m10050"
    assert [row["id"] for row in read] == sorted(row["id"] for row in read)
    assert (limited, more) == (read[:3], True)


async def test_a_readers_page_stops_at_its_byte_budget_and_says_more_follow(db: Database, scope: Scope) -> None:
    """A page of 10,000 messages of 100,000 characters each was a gigabyte in one response."""
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, tool_calls) "
            "SELECT %s, %s, %s, 'assistant', repeat('x', 1000), "
            "CASE WHEN n = 2 THEN jsonb_build_array(repeat('y', 1000)) END FROM generate_series(1, 5) AS n",
            (tree.root_id, run.turn_id, run.run_id))
        first = (await messages.history(conn, tree.root_id))[0]
        pages = []
        after, more = first["id"], True
        while more:
            page, more = await messages.reader_page(conn, tree.root_id, after_id=after, limit=100, max_bytes=2500)
            pages.append([len(row["content"]) for row in page])
            after = page[-1]["id"]
        whole, more_after_whole = await messages.reader_page(conn, tree.root_id, after_id=first["id"], limit=5,
                                                             max_bytes=10**6)
        tiny, _ = await messages.reader_page(conn, tree.root_id, after_id=first["id"], limit=5, max_bytes=1)
        none, more_after_none = await messages.reader_page(conn, tree.root_id, after_id=after, limit=5,
                                                           max_bytes=10**6)

    # The second message carries ~1,000 more bytes of tool calls: the first page ends after it.
    assert pages == [[1000, 1000], [1000, 1000, 1000]]
    assert len(whole) == 5 and not more_after_whole
    assert len(tiny) == 1  # one message however large, or a reader could never get past it
    assert (none, more_after_none) == ([], False)


async def test_a_readers_page_budget_counts_the_text_as_a_response_carries_it(db: Database, scope: Scope) -> None:
    """A control character is one byte stored and six in JSON (``\\u0001``): counted stored, a page
    of them was six times its budget on the wire."""
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO thread_messages (session_id, turn_id, run_id, role, content) "
            "SELECT %s, %s, %s, 'tool', repeat(chr(1), 1000) FROM generate_series(1, 3)",
            (tree.root_id, run.turn_id, run.run_id))
        first = (await messages.history(conn, tree.root_id))[0]
        page, more = await messages.reader_page(conn, tree.root_id, after_id=first["id"], limit=100, max_bytes=2500)
    assert [row["content"] for row in page] == ["\x01" * 1000] and more  # 6,000 bytes: the budget is spent


async def test_a_tool_result_is_found_by_its_turn_and_call(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        assert not await messages.has_tool_result(conn, run.turn_id, "call-1")
        await messages.append_tool_results(conn, run, [("call-1", '{"ok": true}')])
    async with db.tx() as conn:
        assert await messages.has_tool_result(conn, run.turn_id, "call-1")
        assert not await messages.has_tool_result(conn, run.turn_id, "call-2")


async def test_a_refused_summary_serves_only_the_request_its_run_read(db: Database, scope: Scope) -> None:
    # A human's request that came while a summary was being made was cleared with it when the
    # summary failed: it is for the next boundary.
    tree, _ = await start_root_run(db, scope)

    async def state() -> tuple[bool, int | None]:
        async with db.tx() as conn:
            cur = await conn.execute("SELECT compact_requested, compaction_refused_until FROM sessions "
                                     "WHERE session_id = %s", (tree.root_id,))
            row = await cur.fetchone()
        return row["compact_requested"], row["compaction_refused_until"]

    async with db.tx() as conn:
        await conn.execute("UPDATE sessions SET compact_requested = true WHERE session_id = %s", (tree.root_id,))
        await messages.compaction_asked(conn, tree.root_id, refused_until=7, served=False)
    assert await state() == (True, 7)
    async with db.tx() as conn:
        await messages.compaction_asked(conn, tree.root_id, refused_until=9, served=True)
    assert await state() == (False, 9)


def test_the_ignorable_characters_written_out_are_this_pythons() -> None:
    # Written out to spare every process a scan of all code points at import; a Python with newer
    # Unicode data may add some: regenerate persistence/ignorable.py's RANGES (python -m persistence.ignorable).
    assert ignorable.RANGES == ignorable.ignorable_ranges()
