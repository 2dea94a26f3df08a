"""The side-effecting cooperation tools: idempotent per (source Turn, tool call id), scope-confined."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from persistence import cooperation, events, sessions, trees, turns
from persistence.db import Database
from persistence.errors import Conflict, IdempotencyConflict, InvalidArgument, LimitReached, NotFound
from persistence.records import Row, RunRef, Scope
from persistence.settings import get_settings
from tests.persistence.helpers import (
    DISPATCHER,
    PLANNED_AT_SCALE,
    ExplainingConnection,
    child_run,
    claim_turn,
    count_rows,
    create_child,
    expire_lease,
    fetch_all,
    fetch_one,
    finish,
    limits,
    make_tree,
    rows_read,
    start_root_run,
    submit,
    turn_row,
)

Tool = Callable[..., Awaitable[Row]]


async def call(db: Database, tool: Tool, run: RunRef, call_id: str, **args: Any) -> Row:
    async with db.tx() as conn:
        return await tool(conn, run, call_id, **args)


async def create(db: Database, run: RunRef, call_id: str, **args: Any) -> Row:
    fields = {"name": "aaa", "description": "the task", "limits": limits(max_depth=args.pop("max_depth", 2)),
              "dispatcher": DISPATCHER, **args}
    return await call(db, cooperation.create_session, run, call_id, **fields)


async def submit_as(db: Database, run: RunRef, call_id: str, **args: Any) -> Row:
    return await call(db, cooperation.submit_input, run, call_id, dispatcher=DISPATCHER, **args)


async def test_create_session_replay_returns_the_stored_result(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    first = await create(db, run, "call-1")
    before = await count_rows(db)
    assert await create(db, run, "call-1") == first
    assert await count_rows(db) == before
    receipt = await fetch_one(db, "SELECT tool_name, result, first_run_id FROM tool_receipts "
                                  "WHERE turn_id = %s AND tool_call_id = 'call-1'", (run.turn_id,))
    assert receipt == {"tool_name": "create_session", "result": first, "first_run_id": run.run_id}


async def test_create_session_starts_the_childs_first_turn_at_once(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    before = await count_rows(db)
    created = await create(db, run, "call-1", description="find the answer")
    after = await count_rows(db)
    assert {table: after[table] - before[table] for table in ("sessions", "inputs", "turns", "runs")} == {
        "sessions": 1, "inputs": 1, "turns": 1, "runs": 1}
    child = uuid.UUID(created["session_id"])
    assert created["status"] == "started"
    chain = await fetch_one(db, """
        SELECT i.status AS input_status, i.text, i.origin, t.turn_id, t.status AS turn_status,
               r.status AS run_status, r.kind, r.tree_id, r.owner
        FROM inputs i JOIN turns t USING (input_id) JOIN runs r USING (turn_id)
        WHERE i.input_id = %s AND i.session_id = %s""", (uuid.UUID(created["input_id"]), child))
    assert chain == {"input_status": "consumed", "text": "find the answer", "origin": chain["origin"],
                     "turn_id": uuid.UUID(created["turn_id"]), "turn_status": "running",
                     "run_status": "pending", "kind": "start", "tree_id": run.tree_id, "owner": None}
    assert chain["origin"]["kind"] == "session" and chain["origin"]["session_id"] == str(run.session_id)
    first = await fetch_all(db, "SELECT role, content, turn_id, origin FROM thread_messages WHERE session_id = %s",
                            (child,))
    assert first == [{"role": "user", "content": "find the answer", "turn_id": chain["turn_id"],
                      "origin": chain["origin"]}]
    events = await fetch_all(db, "SELECT kind FROM events WHERE session_id = %s ORDER BY cursor", (child,))
    assert [e["kind"] for e in events] == ["session_created", "input_received", "turn_started"]


@pytest.mark.parametrize("changed", [{"name": "bbb"}, {"description": "another task"}, {"mode": "root"},
                                     {"agent_id": "reviewer"}])
async def test_create_session_replay_with_changed_arguments_is_refused(db: Database, scope: Scope,
                                                                       changed: dict[str, Any]) -> None:
    _, run = await start_root_run(db, scope)
    await create(db, run, "call-1")
    before = await count_rows(db)
    with pytest.raises(IdempotencyConflict):
        await create(db, run, "call-1", **changed)
    assert await count_rows(db) == before


async def test_submit_input_replay_and_conflict(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    first = await submit_as(db, run, "call-2", target="/root/aaa", text="more work")
    assert first["status"] == "queued" and first["session_id"] == aaa["session_id"]
    before = await count_rows(db)
    assert await submit_as(db, run, "call-2", target="/root/aaa", text="more work") == first
    assert await count_rows(db) == before
    for changed in ({"target": aaa["session_id"], "text": "more work"}, {"target": "/root/aaa", "text": "other"}):
        with pytest.raises(IdempotencyConflict):
            await submit_as(db, run, "call-2", **changed)
    assert await count_rows(db) == before


async def test_send_message_replay_and_conflict(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    first = await call(db, cooperation.send_message, run, "call-3", target="/root/aaa", text="hello")
    assert first["status"] == "received" and first["session_id"] == aaa["session_id"]
    before = await count_rows(db)
    assert await call(db, cooperation.send_message, run, "call-3", target="/root/aaa", text="hello") == first
    assert await count_rows(db) == before
    with pytest.raises(IdempotencyConflict):
        await call(db, cooperation.send_message, run, "call-3", target="/root/aaa", text="changed")
    assert await count_rows(db) == before
    stored = await fetch_all(db, "SELECT body, source_run_id, source_turn_id, tool_call_id FROM coop_messages "
                                 "WHERE receiver_session_id = %s", (uuid.UUID(aaa["session_id"]),))
    assert stored == [{"body": "hello", "source_run_id": run.run_id, "source_turn_id": run.turn_id,
                       "tool_call_id": "call-3"}]


async def test_cancel_turn_replay_and_conflict(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    bbb = await create_child(db, run, "bbb")
    first = await call(db, cooperation.cancel_turn, run, "call-4", target="/root/aaa", turn_id=aaa["turn_id"])
    assert first == {"status": "accepted", "session_id": aaa["session_id"], "turn_id": aaa["turn_id"]}
    assert (await turn_row(db, aaa["turn_id"]))["status"] == "cancelled"  # its Run was only queued
    before = await count_rows(db)
    again = await call(db, cooperation.cancel_turn, run, "call-4", target="/root/aaa", turn_id=aaa["turn_id"])
    assert again == first
    assert await count_rows(db) == before
    with pytest.raises(IdempotencyConflict):
        await call(db, cooperation.cancel_turn, run, "call-4", target="/root/bbb", turn_id=bbb["turn_id"])
    assert await count_rows(db) == before
    assert (await turn_row(db, bbb["turn_id"]))["status"] == "running"
    # A Turn that had ended is left as it ended, and the caller is told so (it was "accepted").
    ended = await call(db, cooperation.cancel_turn, run, "call-5", target="/root/aaa", turn_id=aaa["turn_id"])
    assert ended == {"status": "already_ended", "session_id": aaa["session_id"], "turn_id": aaa["turn_id"]}
    assert (await turn_row(db, aaa["turn_id"]))["status"] == "cancelled"


async def test_a_message_to_an_archived_session_is_refused(db: Database, scope: Scope) -> None:
    """An archived session takes no input, so it never reads a message: one sent was answered
    "received" and stayed unread for ever."""
    other = await make_tree(db, scope)
    async with db.tx() as conn:
        await trees.archive_root(conn, scope, other.root_id)
    _, run = await start_root_run(db, scope)
    before = await count_rows(db)
    with pytest.raises(Conflict, match="archived"):
        await call(db, cooperation.send_message, run, "call-1", target=str(other.root_id), text="hello")
    assert await count_rows(db) == before


async def test_a_new_turn_may_reuse_a_call_id_and_gets_new_work(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    first = await create(db, run, "call-1")
    sent = await submit_as(db, run, "call-2", target="/root/aaa", text="more")
    await finish(db, run, output="done")

    receipt = await submit(db, scope, tree.root_id, "next task")
    next_run = await claim_turn(db, tree.tree_id, receipt["turn_id"])
    assert next_run.turn_id != run.turn_id
    second = await create(db, next_run, "call-1", name="bbb")
    resent = await submit_as(db, next_run, "call-2", target="/root/aaa", text="more")
    assert second["session_id"] != first["session_id"] and second["path"] == "/root/bbb"
    assert resent["input_id"] != sent["input_id"]
    receipts = await fetch_all(db, "SELECT turn_id, first_run_id FROM tool_receipts WHERE tool_call_id = 'call-1' "
                                   "AND turn_id = ANY(%s) ORDER BY created_at", ([run.turn_id, next_run.turn_id],))
    assert receipts == [{"turn_id": run.turn_id, "first_run_id": run.run_id},
                        {"turn_id": next_run.turn_id, "first_run_id": next_run.run_id}]


async def test_a_resumed_run_of_the_same_turn_replays_and_keeps_the_first_run(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    first = await create(db, run, "call-1")
    # The owner dies: its lease runs out and the Turn is resumed by a new Run.
    async with db.tx() as conn:
        await expire_lease(conn, run.run_id)
        await turns.recover_expired_run(conn, run.run_id)
    resumed = await claim_turn(db, tree.tree_id, run.turn_id)
    assert resumed.run_id != run.run_id and resumed.turn_id == run.turn_id
    before = await count_rows(db)
    assert await create(db, resumed, "call-1") == first
    assert await count_rows(db) == before
    receipt = await fetch_one(db, "SELECT first_run_id FROM tool_receipts WHERE turn_id = %s", (run.turn_id,))
    assert receipt["first_run_id"] == run.run_id


async def test_refused_calls_store_no_receipt(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    before = await count_rows(db)
    with pytest.raises(InvalidArgument):
        await call(db, cooperation.send_message, run, "call-5", target="/root", text="to myself")
    with pytest.raises(InvalidArgument):
        await call(db, cooperation.cancel_turn, run, "call-6", target="/root", turn_id=str(run.turn_id))
    with pytest.raises(NotFound):
        await submit_as(db, run, "call-7", target="/root/nobody", text="x")
    with pytest.raises(InvalidArgument):
        await create(db, run, "call-8", mode="sideways")
    assert await count_rows(db) == before


async def test_a_child_inherits_config_and_a_named_agent_is_frozen(db: Database, scope: Scope) -> None:
    from persistence import agents

    _, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await agents.create_agent(conn, scope, {"agent_id": "reviewer", "name": "Reviewer", "model": "m-1",
                                                "instructions": "review", "approval_mode": "ask"})
    inherited = await create(db, run, "c1", name="aaa")
    frozen = await create(db, run, "c2", name="bbb", agent_id="reviewer")
    async with db.tx() as conn:
        await agents.update_agent(conn, scope, "reviewer", {"model": "m-2"})
    rows = {row["name"]: row for row in await fetch_all(
        db, "SELECT name, agent_id, agent_config FROM sessions WHERE session_id = ANY(%s)",
        ([uuid.UUID(inherited["session_id"]), uuid.UUID(frozen["session_id"])],))}
    assert rows["aaa"]["agent_config"]["model"] == "canopy/scripted"
    assert rows["bbb"]["agent_id"] == "reviewer"
    assert rows["bbb"]["agent_config"]["model"] == "m-1"  # frozen at creation
    assert rows["bbb"]["agent_config"]["approval_mode"] == "ask"  # the agent asks, though its creator does not
    assert rows["aaa"]["agent_config"]["approval_mode"] == "auto"


# --- scope confinement --------------------------------------------------------------------------


@pytest.fixture(params=["other-user", "other-app"])
def other_scope(request: pytest.FixtureRequest, scope: Scope) -> Scope:
    """Another user of the same app, or the same user in another app."""
    suffix = uuid.uuid4().hex[:6]
    if request.param == "other-user":
        return Scope(f"{scope.user_id}-{suffix}", scope.app_id)
    return Scope(scope.user_id, f"{scope.app_id}-{suffix}")


async def test_cross_scope_targets_are_not_found_and_nothing_is_written(
    db: Database, scope: Scope, other_scope: Scope
) -> None:
    # The victim: a session of `scope` with a running Turn and a consumed input.
    victim_tree, victim_run = await start_root_run(db, scope)
    victim = await fetch_one(db, "SELECT input_id FROM turns WHERE turn_id = %s", (victim_run.turn_id,))
    # The caller: a Run in the other scope.
    caller_tree, caller_run = await start_root_run(db, other_scope)
    target = str(victim_tree.root_id)

    before = await count_rows(db)
    attempts: list[Callable[[], Awaitable[Any]]] = [
        lambda: submit_as(db, caller_run, "x1", target=target, text="hi"),
        lambda: call(db, cooperation.send_message, caller_run, "x2", target=target, text="hi"),
        lambda: call(db, cooperation.cancel_turn, caller_run, "x3", target=target,
                     turn_id=str(victim_run.turn_id)),
    ]
    for attempt in attempts:
        with pytest.raises(NotFound):
            await attempt()
    for lookup in (
        lambda conn: turns.get_result(conn, other_scope, input_id=victim["input_id"]),
        lambda conn: turns.get_result(conn, other_scope, turn_id=victim_run.turn_id),
        lambda conn: sessions.resolve_target(conn, other_scope, caller_tree.tree_id, target),
        lambda conn: sessions.get_session(conn, other_scope, victim_tree.root_id),
        lambda conn: turns.submit_input(conn, other_scope, victim_tree.root_id, "hi", {"kind": "human"}),
        lambda conn: turns.cancel_turn(conn, other_scope, victim_tree.root_id, victim_run.turn_id),
        lambda conn: turns.cancel_input(conn, other_scope, victim["input_id"]),
    ):
        with pytest.raises(NotFound):
            async with db.tx() as conn:
                await lookup(conn)
    assert await count_rows(db) == before
    assert (await turn_row(db, victim_run.turn_id))["status"] == "running"


async def test_a_member_of_another_tree_of_the_same_scope_works_by_session_id(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    other_tree, _ = await start_root_run(db, scope)
    sent = await call(db, cooperation.send_message, run, "m1", target=str(other_tree.root_id), text="hello")
    queued = await submit_as(db, run, "s1", target=str(other_tree.root_id), text="work")
    assert sent["session_id"] == queued["session_id"] == str(other_tree.root_id)
    assert queued["status"] == "queued"
    origin = await fetch_one(db, "SELECT origin FROM inputs WHERE input_id = %s", (uuid.UUID(queued["input_id"]),))
    assert origin["origin"]["run_id"] == str(run.run_id) and origin["origin"]["kind"] == "session"


async def test_grandchild_creation_through_child_run_records_origin(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    aaa, aaa_run = await child_run(db, run, "aaa")
    bbb = await create_child(db, aaa_run, "bbb")
    first_input = await fetch_one(db, "SELECT origin FROM inputs WHERE input_id = %s", (uuid.UUID(bbb["input_id"]),))
    assert first_input["origin"]["session_id"] == aaa["session_id"]
    assert first_input["origin"]["path"] == "/root/aaa"


@pytest.fixture
def small_queues(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CANOPY_MAX_PENDING_INPUTS", "2")
    monkeypatch.setenv("CANOPY_MAX_UNREAD_MESSAGES", "3")
    monkeypatch.setenv("CANOPY_MAX_UNREAD_MESSAGE_BYTES", "400000")
    get_settings.cache_clear()
    yield
    monkeypatch.undo()
    get_settings.cache_clear()


async def test_a_sessions_queue_is_bounded_for_models_and_humans(db: Database, scope: Scope,
                                                                 small_queues: None) -> None:
    """A model that gives a session work in a loop (itself included) cannot grow its queue without bound."""
    _, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")  # busy with its first Turn: what it is given waits
    for n in range(2):
        assert (await submit_as(db, run, f"call-{n}", target="/root/aaa", text="more"))["status"] == "queued"
    before = await count_rows(db)

    with pytest.raises(LimitReached, match="CANOPY_MAX_PENDING_INPUTS"):
        await submit_as(db, run, "call-2", target="/root/aaa", text="more")
    with pytest.raises(LimitReached, match="2 inputs waiting"):
        await submit(db, scope, uuid.UUID(aaa["session_id"]), "from a human")

    assert await count_rows(db) == before
    # The root's own queue is its own: it may still be given work.
    assert (await submit_as(db, run, "call-3", target="/root", text="later"))["status"] == "queued"


async def test_a_sessions_unread_messages_are_bounded_in_count_and_bytes(db: Database, scope: Scope,
                                                                         small_queues: None) -> None:
    """Its next model call takes every unread message in: how many and how large is bounded where
    they are sent, and reading them makes room again."""
    _, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    await create_child(db, run, "bbb")
    for n in range(3):
        await call(db, cooperation.send_message, run, f"a-{n}", target="/root/aaa", text="x")
    wide = "é" * 100_000  # 200,000 bytes: two fit in 400,000
    for n in range(2):
        await call(db, cooperation.send_message, run, f"b-{n}", target="/root/bbb", text=wide)
    before = await count_rows(db)

    with pytest.raises(LimitReached, match="CANOPY_MAX_UNREAD_MESSAGES"):
        await call(db, cooperation.send_message, run, "a-3", target="/root/aaa", text="x")
    with pytest.raises(LimitReached, match="CANOPY_MAX_UNREAD_MESSAGE_BYTES"):
        await call(db, cooperation.send_message, run, "b-2", target="/root/bbb", text="y")

    assert await count_rows(db) == before
    async with db.tx() as conn:  # what aaa's next model call does to them
        await conn.execute("UPDATE coop_messages SET processed_at = now() WHERE receiver_session_id = %s",
                           (uuid.UUID(aaa["session_id"]),))
    assert (await call(db, cooperation.send_message, run, "a-4", target="/root/aaa", text="x"))["status"] == "received"


async def test_a_huge_argument_is_not_repeated_in_its_error(db: Database, scope: Scope) -> None:
    """An error goes back into every later model call of its Turn: a megabyte target or id is named by
    its start."""
    _, run = await start_root_run(db, scope)
    huge = "x" * 1_000_000
    for target in (huge, "/root/" + huge):
        with pytest.raises((InvalidArgument, NotFound)) as refused:
            await submit_as(db, run, "call-1", target=target, text="work")
        assert len(str(refused.value)) < 300 and "1000" in str(refused.value), str(refused.value)[:300]
    with pytest.raises(InvalidArgument) as refused:
        await call(db, cooperation.cancel_turn, run, "call-2", target="/root", turn_id=huge)
    assert len(str(refused.value)) < 300


async def test_a_chain_of_inputs_models_give_each_other_ends_at_its_limit(db: Database, scope: Scope) -> None:
    """A Turn that gives its own session (or another that gives it back) the same task, and finishes:
    nothing bounded the Turns that followed, each up to its model call limit. Each input a model gives
    counts one more link than the input of the Turn giving it; past the limit it is refused."""
    _, run = await start_root_run(db, scope)
    limit = get_settings().max_input_hops

    async def links(count: int) -> None:  # the Turn's own input as the given link of a chain
        async with db.tx() as conn:
            await conn.execute("UPDATE inputs SET origin = origin || jsonb_build_object('hops', %s::int) "
                               "WHERE input_id = (SELECT input_id FROM turns WHERE turn_id = %s)", (count, run.turn_id))

    await links(limit - 1)
    given = await submit_as(db, run, "call-a", target="/root", text="the same task again")
    [stored] = await fetch_all(db, "SELECT origin FROM inputs WHERE input_id = %s", (uuid.UUID(given["input_id"]),))
    assert stored["origin"]["hops"] == limit
    await links(limit)
    before = await count_rows(db)
    with pytest.raises(LimitReached, match=f"the limit is {limit} \\(CANOPY_MAX_INPUT_HOPS\\)"):
        await submit_as(db, run, "call-b", target="/root", text="the same task again")
    assert await count_rows(db) == before


async def test_a_sessions_interventions_are_read_apart_from_its_other_events(db: Database, scope: Scope) -> None:
    """The UI reads a session's interventions at every refresh: those on its children (their events
    go to it) were found among every event of the session, each message and Run's."""
    tree, run = await start_root_run(db, scope)
    child, _child_run = await child_run(db, run, "helper")
    _elsewhere, other_run = await start_root_run(db, scope)
    other, _other_run = await child_run(db, other_run, "busy")
    async with db.tx() as conn:
        for _ in range(300):
            await events.append_event(conn, scope, "message", session_id=tree.root_id, tree_id=tree.tree_id)
        for _ in range(100):  # another conversation's
            await cooperation.record_intervention(conn, scope, other["session_id"], "steer", text="and again")
        await cooperation.record_intervention(conn, scope, child["session_id"], "steer", text="faster")
    async with db.tx() as conn:
        await conn.execute("ANALYZE events")
        await conn.execute(PLANNED_AT_SCALE)
        explaining = ExplainingConnection(conn)
        found = await cooperation.interventions(explaining, scope, tree.root_id)  # type: ignore[arg-type]
    assert [row["action"] for row in found] == ["steer"]
    assert rows_read(explaining.plans[-1], "events") <= 1, explaining.plans[-1]
