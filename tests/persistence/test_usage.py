"""Usage per session and per tree, tree budgets, the budget stop, archive refusals and interventions,
read back from the database (persistence/usage.py, trees.py, cooperation.py)."""

from __future__ import annotations

import asyncio
import datetime
import math
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from persistence import cooperation, messages, sessions, trees, usage
from persistence.db import Database
from persistence.errors import Conflict, InvalidArgument, NotFound
from persistence.records import RunRef, Scope
from tests.persistence.helpers import (
    ACTIVE_RUNS_INDEXES,
    AGENT_CONFIG,
    DISPATCHER,
    PLANNED_AT_SCALE,
    ExplainingConnection,
    claim_turn,
    count_rows,
    create_child,
    fetch_all,
    fetch_one,
    finish,
    indexes_read,
    limits,
    make_tree,
    seed_worked_tree,
    session_row,
    start_root_run,
    submit,
    turn_row,
)
from tests.persistence.test_trees import CountingCursor
from tests.persistence.test_waits import park, try_resume

# The runs table's own sums, per tree: what every rollup must equal.
_RUNS_SUM = """
SELECT coalesce(sum(prompt_tokens), 0) AS prompt_tokens, coalesce(sum(completion_tokens), 0) AS completion_tokens,
       coalesce(sum(cost_usd), 0) AS cost_usd, coalesce(sum(model_calls), 0) AS model_calls
FROM runs WHERE tree_id = %s
"""


async def reply(db: Database, run: RunRef, prompt: int, completion: int, cost: float = 0.0,
                tool_calls: list[dict[str, Any]] | None = None) -> None:
    """One committed model reply of ``run`` with this usage (as the agent loop commits it)."""
    async with db.tx() as conn:
        await messages.append_reply(conn, run, content=None if tool_calls else "text", tool_calls=tool_calls,
                                    usage={"prompt_tokens": prompt, "completion_tokens": completion}, cost_usd=cost)


async def summary(db: Database, scope: Scope, tree_id: uuid.UUID) -> dict[str, Any]:
    async with db.tx() as conn:
        return await trees.tree_summary(conn, scope, tree_id)


async def set_budget(db: Database, scope: Scope, tree_id: uuid.UUID, **changes: Any) -> dict[str, Any]:
    async with db.tx() as conn:
        return await usage.set_budget(conn, scope, tree_id, changes)


async def reached(db: Database, tree_id: uuid.UUID) -> dict[str, Any] | None:
    async with db.tx() as conn:
        return await usage.budget_reached(conn, tree_id)


def runs_match(rollup: dict[str, Any], runs: dict[str, Any]) -> bool:
    return (rollup["prompt_tokens"], rollup["completion_tokens"], rollup["model_calls"]) == \
        (runs["prompt_tokens"], runs["completion_tokens"], runs["model_calls"]) \
        and math.isclose(rollup["cost_usd"], runs["cost_usd"], rel_tol=1e-9, abs_tol=1e-12)


# --- the rollup -------------------------------------------------------------------------------------


async def test_tree_and_member_usage_are_the_sums_of_their_runs(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    await reply(db, run, 100, 10, 0.001, tool_calls=[{"id": "c1", "name": "create_session", "arguments": {}}])
    aaa = await create_child(db, run, "aaa")
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])
    await reply(db, aaa_run, 40, 4, 0.0004, tool_calls=[{"id": "w", "name": "wait_inputs", "arguments": {}}])
    # aaa waits and resumes in a second Run, which is charged too.
    wait_id = await park(db, aaa_run, timeout=0)
    assert await try_resume(db, wait_id) is not None
    aaa_resumed = await claim_turn(db, tree.tree_id, aaa["turn_id"])
    await reply(db, aaa_resumed, 50, 5, 0.0005)
    await finish(db, aaa_resumed, output="aaa done")
    await reply(db, run, 200, 20, 0.002)

    found = await summary(db, scope, tree.tree_id)
    runs = await fetch_one(db, _RUNS_SUM, (tree.tree_id,))
    assert runs_match(found["usage"], runs)
    assert (found["usage"]["prompt_tokens"], found["usage"]["completion_tokens"], found["usage"]["model_calls"]) \
        == (390, 39, 4)
    assert found["usage"]["tokens"] == 429
    by_path = {m["path"]: m["usage"] for m in found["members"]}
    assert (by_path["/root"]["tokens"], by_path["/root"]["model_calls"]) == (330, 2)
    assert (by_path["/root/aaa"]["tokens"], by_path["/root/aaa"]["model_calls"]) == (99, 2)
    assert math.isclose(by_path["/root/aaa"]["cost_usd"], 0.0009)
    per_session = await fetch_all(db, "SELECT session_id, sum(prompt_tokens + completion_tokens) AS tokens "
                                      "FROM runs WHERE tree_id = %s GROUP BY session_id", (tree.tree_id,))
    assert {r["session_id"]: r["tokens"] for r in per_session} == \
        {m["session_id"]: m["usage"]["tokens"] for m in found["members"]}
    # A fenced-out reply (a stale owner) charges nothing anywhere.
    stale = RunRef(run.scope, run.session_id, run.tree_id, run.turn_id, run.run_id, "someone-else", run.kind)
    with pytest.raises(Exception, match="no longer held"):
        await reply(db, stale, 10_000, 10_000)
    assert (await summary(db, scope, tree.tree_id))["usage"]["tokens"] == 429


async def test_a_trees_member_usage_is_read_without_its_runs(db: Database, scope: Scope) -> None:
    """The tree summary (read again after each of the tree's events, by every page that shows it)
    summed every Run the tree ever had for its members' usage: 300 of them for 3 members here, a
    long-lived tree's tens of thousands. Each member's usage is a row of its own now."""
    tree = await seed_worked_tree(db, scope, members=3, turns_per_member=100, wait_every=0)
    async with db.tx() as conn:
        await conn.execute("ANALYZE runs")
        await conn.execute(PLANNED_AT_SCALE)
        explaining = ExplainingConnection(conn)
        head = await usage.tree_head(explaining, scope, tree.tree_id)  # type: ignore[arg-type]
    assert len(head["member_usage"]) == 3
    assert {(spent["tokens"], spent["model_calls"]) for spent in head["member_usage"].values()} == {(4800, 100)}
    assert indexes_read(explaining.plans[-1], "runs") <= ACTIVE_RUNS_INDEXES, explaining.plans[-1]  # slots in use


async def test_first_run_at_is_the_trees_first_grant(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    assert (await summary(db, scope, tree.tree_id))["usage"]["first_run_at"] is None
    receipt = await submit(db, scope, tree.root_id)
    run = await claim_turn(db, tree.tree_id, receipt["turn_id"])
    first = await fetch_one(db, "SELECT started_at FROM runs WHERE run_id = %s", (run.run_id,))
    await finish(db, run)
    receipt = await submit(db, scope, tree.root_id, "again")
    await claim_turn(db, tree.tree_id, receipt["turn_id"])
    assert (await summary(db, scope, tree.tree_id))["usage"]["first_run_at"] == first["started_at"]


async def test_summary_statements_do_not_grow_from_10_to_300_members(db: Database, database_url: str,
                                                                      scope: Scope) -> None:
    small = await seed_worked_tree(db, scope, members=10, turns_per_member=2, wait_every=2)
    large = await seed_worked_tree(db, scope, members=300, turns_per_member=1, wait_every=0)
    counted = {}
    for tree in (small, large):
        conn = await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row,
                                                     cursor_factory=CountingCursor)
        try:
            CountingCursor.statements.clear()
            found = await trees.tree_summary(conn, scope, tree.tree_id)  # type: ignore[arg-type]
            counted[tree.tree_id] = (len(CountingCursor.statements), found)
        finally:
            await conn.close()
        runs = await fetch_one(db, _RUNS_SUM, (tree.tree_id,))
        assert runs_match(counted[tree.tree_id][1]["usage"], runs)
    small_statements, small_summary = counted[small.tree_id]
    large_statements, large_summary = counted[large.tree_id]
    assert small_statements == large_statements == 2
    assert len(large_summary["members"]) == 300 and large_summary["usage"]["model_calls"] == 300
    assert small_summary["usage"]["model_calls"] == 20
    assert all(m["usage"]["tokens"] == 48 for m in large_summary["members"])


# --- limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "budget", "below", "at"), [
    ("tokens", {"max_tokens": 1000}, (500, 400, 0.0), (50, 50, 0.0)),
    ("cost_usd", {"max_cost_usd": 0.01}, (1, 1, 0.006), (1, 1, 0.005)),
    ("model_calls", {"max_model_calls": 2}, (1, 1, 0.0), (1, 1, 0.0)),
])
async def test_each_limit_is_reached_at_its_maximum(db: Database, scope: Scope, limit: str, budget: dict[str, Any],
                                                    below: tuple[int, int, float], at: tuple[int, int, float]) -> None:
    tree, run = await start_root_run(db, scope)
    assert (await set_budget(db, scope, tree.tree_id, **budget))[next(iter(budget))] == next(iter(budget.values()))
    await reply(db, run, *below)
    assert await reached(db, tree.tree_id) is None
    async with db.tx() as conn:
        assert (await messages.take_boundary(conn, run)).budget_reached is None
    await reply(db, run, *at)
    found = await reached(db, tree.tree_id)
    assert found is not None and (found["limit"], found["budget_tree_id"]) == (limit, str(tree.tree_id))
    assert found["used"] >= found["max"] == next(iter(budget.values()))
    async with db.tx() as conn:  # the model boundary reads it in its one statement
        assert (await messages.take_boundary(conn, run)).budget_reached == found
    assert (await summary(db, scope, tree.tree_id))["budget_reached"] == found


async def test_wall_time_counts_from_the_first_run(db: Database, scope: Scope) -> None:
    tree, _ = await start_root_run(db, scope)
    await set_budget(db, scope, tree.tree_id, max_seconds=0.5)
    assert await reached(db, tree.tree_id) is None
    await asyncio.sleep(0.7)
    found = await reached(db, tree.tree_id)
    assert found is not None and found["limit"] == "seconds" and found["used"] >= 0.5


async def test_a_spawned_tree_cannot_escape_the_budget_of_the_trees_that_spawned_it(db: Database,
                                                                                      scope: Scope) -> None:
    tree_a, run_a = await start_root_run(db, scope)
    await set_budget(db, scope, tree_a.tree_id, max_tokens=1000)

    async def spawn(run: RunRef, name: str) -> tuple[uuid.UUID, RunRef]:
        async with db.tx() as conn:
            made = await cooperation.create_session(conn, run, f"spawn-{name}", name=name, description="work",
                                                    mode="root", limits=limits(), dispatcher=DISPATCHER)
        tree_id = uuid.UUID(made["tree_id"])
        return tree_id, await claim_turn(db, tree_id, made["turn_id"])

    tree_b, run_b = await spawn(run_a, "b")
    await set_budget(db, scope, tree_b, max_tokens=500)
    tree_c, run_c = await spawn(run_b, "c")
    chain = await fetch_one(db, "SELECT spawn_chain, lineage_id FROM trees WHERE tree_id = %s", (tree_c,))
    assert chain == {"spawn_chain": [tree_a.tree_id, tree_b, tree_c], "lineage_id": tree_a.tree_id}

    await reply(db, run_c, 300, 0)  # C spends; B's budget covers C: 300 of 500
    assert await reached(db, tree_c) is None
    await reply(db, run_b, 200, 0)  # B and C together reach B's 500
    for tree_id in (tree_b, tree_c):
        assert (await reached(db, tree_id)) == {"budget_tree_id": str(tree_b), "limit": "tokens", "max": 500,
                                                "used": 500}
    assert await reached(db, tree_a.tree_id) is None  # A's 1000 covers all three: 500 so far
    await set_budget(db, scope, tree_b, max_tokens=None)  # B's limit removed: C is bound by A's only
    await reply(db, run_a, 400, 100)
    for tree_id in (tree_a.tree_id, tree_b, tree_c):
        found = await reached(db, tree_id)
        assert found is not None and (found["budget_tree_id"], found["used"]) == (str(tree_a.tree_id), 1000)
    head = await summary(db, scope, tree_a.tree_id)
    assert head["usage"]["tokens"] == 500 and head["spawned_usage"]["tokens"] == 500
    assert head["spawned_usage"]["trees"] == 2
    assert (await summary(db, scope, tree_b))["spawned_usage"]["tokens"] == 300


async def test_work_cannot_leave_a_budget_through_another_trees_queue(db: Database, scope: Scope) -> None:
    """A tree under a budget hands its task to a tree of the user's outside its spawn chain, whose
    work that budget would not count: refused, nothing written. Into its own spawned tree (which
    the budget covers) it may; a tree without a budget may hand work anywhere, as before."""
    tree_a, run_a = await start_root_run(db, scope)
    await set_budget(db, scope, tree_a.tree_id, max_model_calls=3)
    outside = await make_tree(db, scope)
    async with db.tx() as conn:
        spawned = await cooperation.create_session(conn, run_a, "spawn", name="side", description="work",
                                                   mode="root", limits=limits(), dispatcher=DISPATCHER)
    await finish(db, await claim_turn(db, uuid.UUID(spawned["tree_id"]), spawned["turn_id"]))

    before = await count_rows(db)
    with pytest.raises(Conflict, match=f"budget of tree {tree_a.tree_id}"):
        async with db.tx() as conn:
            await cooperation.submit_input(conn, run_a, "out", target=str(outside.root_id), text="the whole task",
                                           dispatcher=DISPATCHER)
    assert await count_rows(db) == before
    async with db.tx() as conn:
        inside = await cooperation.submit_input(conn, run_a, "in", target=spawned["session_id"], text="more",
                                                dispatcher=DISPATCHER)
    assert inside["status"] == "started"

    _, free_run = await start_root_run(db, scope)  # no budget over it
    async with db.tx() as conn:
        anywhere = await cooperation.submit_input(conn, free_run, "any", target=str(outside.root_id), text="help",
                                                  dispatcher=DISPATCHER)
    assert anywhere["status"] == "started"


async def test_a_spawned_tree_takes_its_agents_default_budget(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        await conn.execute("UPDATE sessions SET agent_config = agent_config || %s WHERE session_id = %s",
                           (psycopg.types.json.Jsonb({"budget": {"max_model_calls": 7}}), tree.root_id))
        made = await cooperation.create_session(conn, run, "spawn", name="s", description="work", mode="root",
                                                limits=limits(), dispatcher=DISPATCHER)
    assert (await summary(db, scope, uuid.UUID(made["tree_id"])))["budget"] == {
        "max_tokens": None, "max_cost_usd": None, "max_seconds": None, "max_model_calls": 7}


@pytest.mark.parametrize("bad", [
    {"max_tokens": 0}, {"max_tokens": -5}, {"max_tokens": 1.5}, {"max_cost_usd": float("nan")},
    {"max_seconds": float("inf")}, {"max_model_calls": True}, {"max_tokens": "100"}, {"max_wishes": 3},
])
async def test_invalid_budgets_are_refused_and_change_nothing(db: Database, scope: Scope, bad: dict[str, Any]) -> None:
    tree = await make_tree(db, scope)
    await set_budget(db, scope, tree.tree_id, max_tokens=100)
    before = await count_rows(db)
    events = await fetch_all(db, "SELECT cursor FROM events WHERE tree_id = %s", (tree.tree_id,))
    with pytest.raises(InvalidArgument):
        await set_budget(db, scope, tree.tree_id, **bad)
    with pytest.raises(InvalidArgument):
        async with db.tx() as conn:
            await sessions.create_root(conn, scope, project_id=tree.project_id, agent_id=None,
                                       agent_config=AGENT_CONFIG, slot_limit=4, budget=bad)
    assert await count_rows(db) == before
    assert await fetch_all(db, "SELECT cursor FROM events WHERE tree_id = %s", (tree.tree_id,)) == events
    assert (await summary(db, scope, tree.tree_id))["budget"]["max_tokens"] == 100


async def test_another_scopes_budget_is_not_found(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    other = Scope(scope.user_id + "-other", scope.app_id)
    with pytest.raises(NotFound):
        await set_budget(db, other, tree.tree_id, max_tokens=5)
    assert (await summary(db, scope, tree.tree_id))["budget"]["max_tokens"] is None


# --- the budget stop --------------------------------------------------------------------------------


async def test_a_budget_stop_is_a_whole_tree_stop_with_its_reason(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])
    bbb = await create_child(db, run, "bbb")
    later = await submit(db, scope, uuid.UUID(bbb["session_id"]), "bbb's next task")
    await set_budget(db, scope, tree.tree_id, max_tokens=100)
    await reply(db, aaa_run, 90, 20)

    async with db.tx() as conn:
        signalled = await trees.stop_for_budget(conn, scope, tree.tree_id, aaa_run.turn_id)
    assert set(signalled or []) == {tree.root_id, aaa_run.session_id}
    row = await fetch_one(db, "SELECT stopped, stop_reason, stop_detail FROM trees WHERE tree_id = %s",
                          (tree.tree_id,))
    detail = {"budget_tree_id": str(tree.tree_id), "limit": "tokens", "max": 100, "used": 110}
    assert row == {"stopped": True, "stop_reason": "budget_exceeded", "stop_detail": detail}
    assert (await turn_row(db, run.turn_id))["status"] == "cancelling"
    assert (await turn_row(db, aaa["turn_id"]))["status"] == "cancelling"
    assert (await turn_row(db, bbb["turn_id"]))["status"] == "cancelled"  # it was queued for a slot
    assert (await session_row(db, bbb["session_id"]))["queue_paused"] is True
    assert (await fetch_one(db, "SELECT status FROM inputs WHERE input_id = %s", (later["input_id"],)))["status"] \
        == "pending"
    stopped = await fetch_all(db, "SELECT payload FROM events WHERE tree_id = %s AND kind = 'tree_stopped'",
                              (tree.tree_id,))
    assert [e["payload"] for e in stopped] == [{"reason": "budget_exceeded", **detail}]
    cancelling = await fetch_one(db, "SELECT payload FROM events WHERE turn_id = %s AND kind = 'turn_cancelling'",
                                 (aaa_run.turn_id,))
    assert "budget is used up (tokens 110 of 100)" in cancelling["payload"]["reason"]
    head = await summary(db, scope, tree.tree_id)
    assert (head["stop_reason"], head["stop_detail"]) == ("budget_exceeded", detail)

    # A second Run that found it too, its Turn already cancelled by the first stop: nothing more.
    before = await count_rows(db)
    async with db.tx() as conn:
        assert await trees.stop_for_budget(conn, scope, tree.tree_id, run.turn_id) == []
    assert await count_rows(db) == before


async def test_a_late_budget_finding_does_not_stop_a_tree_whose_budget_was_raised(db: Database,
                                                                                    scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    await set_budget(db, scope, tree.tree_id, max_model_calls=1)
    await reply(db, run, 1, 1)
    assert await reached(db, tree.tree_id) is not None  # what the Run's boundary found
    await set_budget(db, scope, tree.tree_id, max_model_calls=10)  # raised before its stop ran
    before = await count_rows(db)
    async with db.tx() as conn:
        assert await trees.stop_for_budget(conn, scope, tree.tree_id, run.turn_id) is None
    assert await count_rows(db) == before
    assert (await turn_row(db, run.turn_id))["status"] == "running"
    assert not (await summary(db, scope, tree.tree_id))["stopped"]


async def test_continue_and_a_humans_input_are_refused_while_the_budget_is_used_up(db: Database,
                                                                                  scope: Scope) -> None:
    """A human's input runs a member of a stopped tree, but one stopped for its budget would stop
    again at the input's first model call, cancelling the Turn that took the input: it was accepted,
    then thrown away. It is refused, as Continue is, until the budget is raised."""
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    await submit(db, scope, uuid.UUID(aaa["session_id"]), "aaa's second task")
    await set_budget(db, scope, tree.tree_id, max_tokens=10)
    await reply(db, run, 10, 5)
    async with db.tx() as conn:
        await trees.stop_for_budget(conn, scope, tree.tree_id, run.turn_id)
    await finish(db, run, "cancelled")

    before = await count_rows(db)
    with pytest.raises(Conflict, match=r"budget is used up \(tokens 15 of 10\); raise it"):
        async with db.tx() as conn:
            await trees.continue_tree(conn, scope, tree.tree_id)
    with pytest.raises(Conflict, match=r"budget is used up \(tokens 15 of 10\); raise it .* before giving it input"):
        await submit(db, scope, tree.root_id, "more")
    assert await count_rows(db) == before
    assert (await session_row(db, aaa["session_id"]))["queue_paused"] is True
    assert (await summary(db, scope, tree.tree_id))["stop_reason"] == "budget_exceeded"

    await set_budget(db, scope, tree.tree_id, max_tokens=1000)
    async with db.tx() as conn:
        started = await trees.continue_tree(conn, scope, tree.tree_id)
    assert started == [uuid.UUID(aaa["session_id"])]
    head = await summary(db, scope, tree.tree_id)
    assert (head["stopped"], head["stop_reason"], head["stop_detail"]) == (False, None, None)
    assert (await session_row(db, aaa["session_id"]))["queue_paused"] is False
    assert (await submit(db, scope, tree.root_id, "more"))["status"] == "started"


async def test_a_human_stop_records_its_reason(db: Database, scope: Scope) -> None:
    tree, _ = await start_root_run(db, scope)
    async with db.tx() as conn:
        await trees.stop_tree(conn, scope, tree.tree_id)
    head = await summary(db, scope, tree.tree_id)
    assert (head["stopped"], head["stop_reason"], head["stop_detail"]) == (True, "user", None)
    assert head["stopped_at"] is not None
    event = await fetch_one(db, "SELECT payload FROM events WHERE tree_id = %s AND kind = 'tree_stopped'",
                            (tree.tree_id,))
    assert event["payload"] == {"reason": "user"}


# --- archive (SPEC §7) ------------------------------------------------------------------------------


async def archive(db: Database, scope: Scope, root_id: uuid.UUID) -> None:
    async with db.tx() as conn:
        await trees.archive_root(conn, scope, root_id)


async def archived(db: Database, tree_id: uuid.UUID) -> list[bool]:
    rows = await fetch_all(db, "SELECT archived FROM trees WHERE tree_id = %s UNION ALL "
                               "SELECT archived FROM sessions WHERE tree_id = %s", (tree_id, tree_id))
    return [row["archived"] for row in rows]


async def test_archive_is_refused_while_a_stopped_tree_keeps_pending_inputs(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    await submit(db, scope, uuid.UUID(aaa["session_id"]), "queued behind aaa's first task")
    async with db.tx() as conn:
        await trees.stop_tree(conn, scope, tree.tree_id)
    await finish(db, run, "cancelled")
    head = await summary(db, scope, tree.tree_id)
    assert {m["activity"] for m in head["members"]} == {"idle"}  # paused queues look idle

    before = await count_rows(db)
    with pytest.raises(Conflict, match="/root/aaa has 1 pending input"):
        await archive(db, scope, tree.root_id)
    assert await count_rows(db) == before
    assert await archived(db, tree.tree_id) == [False, False, False]


async def test_archive_is_refused_while_a_request_is_open(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    await park(db, run, "answer", request={"question": "which colour?"})
    before = await count_rows(db)
    with pytest.raises(Conflict, match="waiting_answer"):
        await archive(db, scope, tree.root_id)
    assert await count_rows(db) == before
    assert await archived(db, tree.tree_id) == [False, False]


async def test_an_archived_tree_cannot_be_continued_or_stopped_and_is_hidden_from_lists(db: Database, scope: Scope
                                                                                        ) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    aaa_run = await claim_turn(db, tree.tree_id, aaa["turn_id"])
    await finish(db, aaa_run)
    await finish(db, run)
    async with db.tx() as conn:
        await trees.stop_tree(conn, scope, tree.tree_id)
    await archive(db, scope, tree.root_id)

    before = await count_rows(db)
    with pytest.raises(Conflict, match="archived"):
        async with db.tx() as conn:
            await trees.continue_tree(conn, scope, tree.tree_id)
    # Nothing in it runs: a stop would only be one more event after its streams ended.
    with pytest.raises(Conflict, match="archived"):
        async with db.tx() as conn:
            await trees.stop_tree(conn, scope, tree.tree_id)
    assert await count_rows(db) == before
    assert (await summary(db, scope, tree.tree_id))["stopped"] is True

    async with db.tx() as conn:
        hidden = await sessions.list_project_sessions(conn, scope, tree.project_id)
        shown = await sessions.list_project_sessions(conn, scope, tree.project_id, include_archived=True)
        everything = await sessions.list_scope_sessions(conn, scope, offset=0, limit=100)
        with_archived = await sessions.list_scope_sessions(conn, scope, offset=0, limit=100, include_archived=True)
    assert tree.root_id not in [r["session_id"] for r in hidden + everything]
    assert tree.root_id in [r["session_id"] for r in with_archived]
    assert {r["session_id"] for r in shown} >= {tree.root_id, aaa_run.session_id}
    assert {r["status"] for r in shown if r["tree_id"] == tree.tree_id} == {"archived"}


# --- interventions ----------------------------------------------------------------------------------


async def test_interventions_are_found_from_the_member_and_from_its_parent(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    aaa_id = uuid.UUID(aaa["session_id"])
    async with db.tx() as conn:
        await cooperation.record_intervention(conn, scope, aaa_id, "steer", {"message_id": "m"}, text="x" * 600)
        await cooperation.record_intervention(conn, scope, aaa_id, "input", {"input_id": "i"}, text="do more")
        await cooperation.record_intervention(conn, scope, tree.root_id, "steer", text="to the root")  # no parent
    async with db.tx() as conn:
        of_member = await cooperation.interventions(conn, scope, aaa_id)
        of_parent = await cooperation.interventions(conn, scope, tree.root_id)
        after_first = await cooperation.interventions(conn, scope, aaa_id, after=of_member[0]["cursor"])
    assert [i["action"] for i in of_member] == [i["action"] for i in of_parent] == ["steer", "input"]
    assert of_member == of_parent and after_first == of_member[1:]
    steer = of_member[0]
    assert (steer["parent_session_id"], steer["member_session_id"], steer["path"]) == (tree.root_id, aaa_id,
                                                                                       "/root/aaa")
    assert steer["payload"]["text"] == "x" * cooperation.INTERVENTION_PREVIEW and steer["payload"]["truncated"]
    with pytest.raises(NotFound):
        async with db.tx() as conn:
            await cooperation.interventions(conn, Scope(scope.user_id, "another-app"), aaa_id)


async def test_budget_stopped_trees_are_counted_for_metrics(db: Database, scope: Scope) -> None:
    async with db.tx() as conn:
        before = await usage.budget_stopped_trees(conn)
    tree, run = await start_root_run(db, scope)
    await set_budget(db, scope, tree.tree_id, max_tokens=5)
    await reply(db, run, 7, 3, 0.5)
    async with db.tx() as conn:
        await trees.stop_for_budget(conn, scope, tree.tree_id, run.turn_id)
        assert await usage.budget_stopped_trees(conn) == before + 1
    await finish(db, run, "cancelled")
    await set_budget(db, scope, tree.tree_id, max_tokens=None)
    async with db.tx() as conn:
        await trees.continue_tree(conn, scope, tree.tree_id)
        assert await usage.budget_stopped_trees(conn) == before


def test_budget_limits_are_checked_before_any_statement() -> None:
    assert usage.check_budget({"max_tokens": 10.0}) == {"max_tokens": 10, "max_cost_usd": None, "max_seconds": None,
                                                        "max_model_calls": None}
    assert usage.check_budget(None) == dict.fromkeys(usage.LIMIT_COLUMNS)
    # An integer too large for a float (the Python API; pydantic bounds the HTTP body first).
    for limit in ("max_tokens", "max_cost_usd"):
        with pytest.raises(InvalidArgument, match=f"budget limit {limit} must be a positive number"):
            usage.check_budget({limit: 10**400})
    assert usage.describe_reached({"limit": "cost_usd", "used": 0.0123, "max": 0.01}) == \
        "cost (USD) 0.0123 of 0.0100"


async def test_model_calls_are_recorded_together(db: Database) -> None:
    run_id = uuid.uuid4()
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    async with db.tx() as conn:
        await usage.record_model_calls(conn, [(run_id, "m1", 10, 2, 0.5, 120.0, None, at, "node-a"),
                                              (run_id, "m2", 0, 0, 0.0, 30.0, "timeout", at, "node-b")])
    found = await fetch_all(db, "SELECT model, prompt_tokens, completion_tokens, cost_usd, latency_ms, error, "
                                "created_at, node_id FROM model_calls WHERE run_id = %s ORDER BY model", (run_id,))
    assert [tuple(row.values()) for row in found] == [("m1", 10, 2, 0.5, 120.0, None, at, "node-a"),
                                                      ("m2", 0, 0, 0.0, 30.0, "timeout", at, "node-b")]
