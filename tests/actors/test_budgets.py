"""Usage and budgets on the real runtime (Ray, PostgreSQL, the scripted model through litellm): the
rollup equals the runs table after a fan-out and after a kill -9 mid-Turn; a token budget that runs
out halfway through a fan-out stops the tree at the model boundary (no model call starts after the
stop), continue is refused until it is raised and then finishes the work; model-call and wall-time
limits; a tree spawned with create_session(mode="root") cannot escape its spawner's budget."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable
from typing import Any

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.errors import Conflict
from persistence.records import Scope
from tests.actors.helpers import eventually, kill_session_process, rows, session_id_at
from tests.actors.test_recovery import _owned_run

CHILDREN = 4
STEPS = 3  # read-only tool steps per task, then the answer
DELAY_MS = 120

_RUNS_SUM = """
SELECT coalesce(sum(prompt_tokens), 0) AS prompt_tokens, coalesce(sum(completion_tokens), 0) AS completion_tokens,
       coalesce(sum(cost_usd), 0) AS cost_usd, coalesce(sum(model_calls), 0) AS model_calls
FROM runs WHERE tree_id = %s
"""


def task(name: str, part: int) -> str:
    steps = [call(("list_agents", {}), delay_ms=DELAY_MS) for _ in range(STEPS)]
    return script(*steps, say(f"{name} part {part} done", delay_ms=DELAY_MS), task=f"{name}, part {part}")


TASKS = 3  # per child: the first is its description, the others are queued behind it


def fan_out() -> str:
    """Four children, each given three multi-step tasks (the later ones queued behind the first)."""
    names = [f"w{i}" for i in range(CHILDREN)]
    return script(
        call(*(create(n, task(n, 1)) for n in names)),
        *(call(*(("submit_input", {"target": f"/root/{n}", "text": task(n, part)}) for n in names))
          for part in range(2, TASKS + 1)),
        call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(TASKS * CHILDREN)],
                              "timeout_seconds": 600})),
        say("all done"),
        task="Fan out to four workers, three tasks each",
    )


async def model_calls_of(runtime: Runtime, *tree_ids: uuid.UUID) -> int:
    """The gateway's records of the trees' model calls (written ~50 ms after each call)."""
    found = await rows(runtime.db, "SELECT count(*) AS n FROM model_calls m JOIN runs r USING (run_id) "
                                   "WHERE r.tree_id = ANY(%s)", list(tree_ids))
    return found[0]["n"]


async def runs_sum(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any]:
    return (await rows(runtime.db, _RUNS_SUM, tree_id))[0]


def assert_rollup_is_the_runs(summary: dict[str, Any], runs: dict[str, Any]) -> None:
    spent = summary["usage"]
    assert (spent["prompt_tokens"], spent["completion_tokens"], spent["model_calls"]) == \
        (runs["prompt_tokens"], runs["completion_tokens"], runs["model_calls"])
    assert math.isclose(spent["cost_usd"], runs["cost_usd"], abs_tol=1e-12)
    members = summary["members"]
    assert sum(m["usage"]["tokens"] for m in members) == spent["tokens"]
    assert sum(m["usage"]["model_calls"] for m in members) == spent["model_calls"]


async def assistant_replies(runtime: Runtime, tree_id: uuid.UUID) -> int:
    found = await rows(runtime.db, "SELECT count(*) AS n FROM thread_messages m JOIN sessions s USING (session_id) "
                                   "WHERE s.tree_id = %s AND m.role = 'assistant'", tree_id)
    return found[0]["n"]


@pytest.mark.default_shape  # the rollup sums committed rows, wherever the sessions made them
async def test_the_rollup_equals_the_runs_after_a_fan_out(runtime: Runtime, scope: Scope) -> None:
    created = await runtime.create_root(scope, input_text=fan_out())
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
    assert (result["status"], result["output"]) == ("completed", "all done")
    summary = await runtime.wait_tree_idle(scope, tree_id)
    assert_rollup_is_the_runs(summary, await runs_sum(runtime, tree_id))
    # Every committed reply is one model call: the root's steps, and TASKS x (STEPS + 1) per child.
    assert summary["usage"]["model_calls"] == TASKS + 2 + CHILDREN * TASKS * (STEPS + 1) \
        == await assistant_replies(runtime, tree_id)
    assert summary["usage"]["prompt_tokens"] > 0 and summary["usage"]["completion_tokens"] > 0
    first_run = await rows(runtime.db, "SELECT min(started_at) AS at FROM runs WHERE tree_id = %s", tree_id)
    assert summary["usage"]["first_run_at"] == first_run[0]["at"]


@pytest.mark.default_shape  # the stop is a committed row every Run's boundary reads, in either process
async def test_a_token_budget_that_runs_out_halfway_stops_the_tree_and_continue_finishes_it(
        runtime: Runtime, scope: Scope) -> None:
    # The same fan-out without a budget: what the whole of it costs in tokens.
    calibration = await runtime.create_root(scope, input_text=fan_out())
    await runtime.wait_result(scope, calibration["input"]["input_id"], timeout=120)
    whole = (await runtime.wait_tree_idle(scope, calibration["session"]["session_id"]))["usage"]["tokens"]
    budget = whole // 2

    created = await runtime.create_root(scope, input_text=fan_out(), budget={"max_tokens": budget})
    tree_id = created["session"]["session_id"]

    async def stopped_and_settled() -> dict[str, Any] | None:
        summary = await runtime.tree_summary(scope, tree_id)
        settled = all(m["turn_status"] in (None, "completed", "failed", "cancelled") for m in summary["members"])
        return summary if summary["stopped"] and settled else None

    summary = await eventually(stopped_and_settled, timeout=120)
    assert summary["stop_reason"] == "budget_exceeded"
    detail = summary["stop_detail"]
    assert (detail["limit"], detail["max"], detail["budget_tree_id"]) == ("tokens", budget, str(tree_id))
    assert detail["used"] >= budget
    stopped_at = summary["stopped_at"]
    event = await rows(runtime.db, "SELECT payload FROM events WHERE tree_id = %s AND kind = 'tree_stopped'", tree_id)
    assert [e["payload"]["reason"] for e in event] == ["budget_exceeded"]
    assert event[0]["payload"]["limit"] == "tokens"
    spent = summary["usage"]["tokens"]
    # Overshoot: at most the calls in flight when the limit was crossed, one per slot.
    biggest_call = await rows(runtime.db, "SELECT max(m.prompt_tokens + m.completion_tokens) AS n FROM model_calls m "
                                          "JOIN runs r USING (run_id) WHERE r.tree_id = %s", tree_id)
    assert budget <= spent < budget + summary["slot_limit"] * biggest_call[0]["n"]
    assert spent < whole  # it stopped before the end
    paused = [m for m in summary["members"] if m["pending_inputs"]]
    assert paused and all(m["queue_paused"] for m in paused)  # later tasks wait, paused

    # Continue is refused while the budget is used up, and changes nothing.
    events_before = await rows(runtime.db, "SELECT count(*) AS n FROM events WHERE tree_id = %s", tree_id)
    with pytest.raises(Conflict, match="budget is used up"):
        await runtime.continue_tree(scope, tree_id)
    again = await runtime.tree_summary(scope, tree_id)
    assert again["stopped"] and again["stop_reason"] == "budget_exceeded"
    assert [m["pending_inputs"] for m in again["members"]] == [m["pending_inputs"] for m in summary["members"]]
    assert await rows(runtime.db, "SELECT count(*) AS n FROM events WHERE tree_id = %s", tree_id) == events_before

    # No Run and no model call started between the stop's commit and the continue.
    await runtime.set_budget(scope, tree_id, {"max_tokens": whole * 3})
    started = await runtime.continue_tree(scope, tree_id)
    assert started
    continued = await rows(runtime.db, "SELECT created_at FROM events WHERE tree_id = %s AND kind = 'tree_continued'",
                           tree_id)
    continued_at = continued[0]["created_at"]
    late_runs = await rows(runtime.db, "SELECT run_id FROM runs WHERE tree_id = %s AND started_at > %s "
                                       "AND started_at < %s", tree_id, stopped_at, continued_at)
    late_calls = await rows(
        runtime.db, "SELECT m.id, r.started_at < %s AS in_flight FROM model_calls m JOIN runs r USING (run_id) "
                    "WHERE r.tree_id = %s AND m.created_at - make_interval(secs => m.latency_ms / 1000) > %s "
                    "AND m.created_at - make_interval(secs => m.latency_ms / 1000) < %s",
        stopped_at, tree_id, stopped_at, continued_at)
    # The gateway times a call from its own start, one Ray call after the Run's boundary decided it,
    # and stopped_at is the stop's statement, before its commit: on a loaded machine a call decided
    # before the stop begins after stopped_at. Only those: one per slot at most, each of a Run that
    # was already running (and whose Turn the stop cancelled).
    assert late_runs == [] and len(late_calls) <= summary["slot_limit"], late_calls
    assert all(call["in_flight"] for call in late_calls), late_calls

    # With the raised budget the paused work runs to its end.
    final = await runtime.wait_tree_idle(scope, tree_id, timeout=120)
    assert not final["stopped"] and final["stop_reason"] is None
    assert all(m["pending_inputs"] == 0 for m in final["members"])
    after = await rows(runtime.db, "SELECT t.status FROM turns t JOIN sessions s USING (session_id) "
                                   "WHERE s.tree_id = %s AND t.created_at >= %s", tree_id, continued_at)
    assert after and {t["status"] for t in after} == {"completed"}
    assert_rollup_is_the_runs(final, await runs_sum(runtime, tree_id))
    assert final["usage"]["model_calls"] == await assistant_replies(runtime, tree_id)


@pytest.mark.default_shape  # a lost Run's lease runs out whichever process it was in (test_recovery.py)
async def test_the_rollup_equals_the_runs_after_kill_9_mid_turn(runtime: Runtime, scope: Scope) -> None:
    # Its first reply acts (a message), so it is committed alone and the failpoint pauses after it.
    member = script(call(("send_message", {"target": "/root", "text": "hello once"})), call(("list_agents", {})),
                    say("member done"))
    text = script(call(create("fp-member", member)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("root done"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    member_id = await eventually(lambda: _at(runtime, tree_id, "/root/fp-member"))
    await eventually(lambda: _owned_run(runtime, member_id))
    # Killed after its first reply is committed (and charged), before any tool ran.
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM thread_messages WHERE session_id = %s "
                                  "AND role = 'assistant'", member_id))
    await kill_session_process(runtime, member_id, "kill -9")
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"] == "root done"
    summary = await runtime.wait_tree_idle(scope, tree_id)
    assert_rollup_is_the_runs(summary, await runs_sum(runtime, tree_id))
    recovered = await rows(runtime.db, "SELECT count(*) AS n FROM runs WHERE session_id = %s AND error LIKE "
                                       "'lease expired%%'", member_id)
    assert recovered[0]["n"] >= 1
    assert summary["usage"]["model_calls"] == await assistant_replies(runtime, tree_id) == 3 + 3
    sent = await rows(runtime.db, "SELECT count(*) AS n FROM coop_messages WHERE sender_session_id = %s", member_id)
    assert sent[0]["n"] == 1


async def _at(runtime: Runtime, tree_id: uuid.UUID, path: str) -> uuid.UUID | None:
    found = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = %s", tree_id, path)
    return found[0]["session_id"] if found else None


async def test_a_model_call_budget_lets_exactly_that_many_calls_start(runtime: Runtime, scope: Scope) -> None:
    text = script(*(call(("list_agents", {})) for _ in range(5)), say("never reached"))
    created = await runtime.create_root(scope, input_text=text, budget={"max_model_calls": 2})
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    # The same words whichever stopped the tree first, this Run at its boundary or the sweeper.
    assert (result["status"], result["error"]) == ("cancelled", "stopped: the tree's budget is used up (model calls "
                                                                "2 of 2)"), result
    summary = await runtime.tree_summary(scope, tree_id)
    assert (summary["stop_reason"], summary["stop_detail"]["limit"]) == ("budget_exceeded", "model_calls")
    assert summary["usage"]["model_calls"] == 2
    await eventually(lambda: _equals(model_calls_of(runtime, tree_id), 2))
    await asyncio.sleep(0.5)
    assert await model_calls_of(runtime, tree_id) == 2  # no third call started


async def test_a_wall_time_budget_stops_a_long_turn(runtime: Runtime, scope: Scope) -> None:
    text = script(*(call(("list_agents", {}), delay_ms=1200) for _ in range(10)), say("never reached"))
    created = await runtime.create_root(scope, input_text=text, budget={"max_seconds": 2})
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "cancelled"
    summary = await runtime.tree_summary(scope, tree_id)
    assert summary["stop_reason"] == "budget_exceeded"
    assert summary["stop_detail"]["limit"] == "seconds" and summary["stop_detail"]["used"] >= 2
    # Counted from the tree's first grant (a slow actor start counts too), so how many of the 1.2 s
    # calls fit depends on the machine; the stop comes 2 s after the grant, never before.
    assert (summary["stopped_at"] - summary["usage"]["first_run_at"]).total_seconds() >= 2
    assert summary["usage"]["model_calls"] < 10


async def test_a_spawned_tree_cannot_escape_its_spawners_budget(runtime: Runtime, scope: Scope) -> None:
    # The spawned tree's first call lasts long enough for the root's second to be charged meanwhile:
    # a call under way when the budget is crossed still counts (README, "Overshoot"), and the
    # figures below are exact only if none is.
    spawned = script(call(("list_agents", {}), delay_ms=2000), *(call(("list_agents", {})) for _ in range(3)),
                     say("spawned done"))
    text = script(call(("create_session", {"name": "side", "description": spawned, "mode": "root"})),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("root done"))
    created = await runtime.create_root(scope, input_text=text, budget={"max_model_calls": 4})
    tree_id = created["session"]["session_id"]
    side = await eventually(lambda: rows(runtime.db, "SELECT tree_id FROM trees WHERE spawned_by_tree_id = %s",
                                         tree_id))
    side_id = side[0]["tree_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "cancelled"  # its wait resumed at a Run start over budget
    root, spawned_tree = await runtime.tree_summary(scope, tree_id), await runtime.tree_summary(scope, side_id)
    for summary in (root, spawned_tree):
        assert summary["stop_reason"] == "budget_exceeded"
        assert (summary["stop_detail"]["budget_tree_id"], summary["stop_detail"]["limit"]) == (str(tree_id),
                                                                                               "model_calls")
    # The root's two calls and two of the spawned tree's: four, the lineage's budget, and no more.
    assert (root["usage"]["model_calls"], spawned_tree["usage"]["model_calls"]) == (2, 2)
    assert root["spawned_usage"]["model_calls"] == 2 and root["spawned_usage"]["trees"] == 1
    assert spawned_tree["lineage_id"] == tree_id and spawned_tree["spawned_by_tree_id"] == tree_id
    await eventually(lambda: _equals(model_calls_of(runtime, tree_id, side_id), 4))
    await asyncio.sleep(0.5)
    assert await model_calls_of(runtime, tree_id, side_id) == 4
    assert await session_id_at(runtime.db, side_id, "/root") == side_id


async def _equals(value: Awaitable[Any], expected: Any) -> bool:
    return await value == expected
