"""Kill tests: any actor may die at any step; the tree still finishes, nothing happens twice.

Sessions named ``fp-…`` pause 3 s at the failpoints configured in conftest, which gives
the test an exact window to kill their actor: before a model call, and after the model's
reply (with tool calls) is committed but before any tool ran.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import pytest
import ray
from ray.util.state import list_actors

from actors.gateway_actor import CALLER_GONE
from actors.naming import session_actor_name, tree_actor_name
from actors.placement import Dedicated, Hosted
from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.records import Scope
from tests.actors.helpers import (
    a_root_in_host,
    eventually,
    kill_session_process,
    model_calls_waiting,
    model_gateway,
    peak_concurrent_runs,
    rows,
    session_id_at,
)


async def _owned_run(runtime: Runtime, session_id: uuid.UUID) -> bool:
    return bool(await rows(runtime.db, "SELECT 1 FROM runs WHERE session_id = %s AND status = 'running' "
                           "AND owner IS NOT NULL", session_id))


async def _assert_clean_finish(runtime: Runtime, scope: Scope, tree_id: uuid.UUID, input_id: uuid.UUID) -> dict:
    result = await runtime.wait_result(scope, input_id, timeout=90)
    await runtime.wait_tree_idle(scope, tree_id, timeout=60)
    open_inputs = await rows(runtime.db, "SELECT i.status FROM inputs i JOIN sessions s USING (session_id) "
                             "WHERE s.tree_id = %s AND i.status = 'pending'", tree_id)
    assert open_inputs == []
    assert await peak_concurrent_runs(runtime.db, tree_id) <= 4
    return result


# Each failpoint and each way to kill, pairwise (not every pair: the two kills end the process
# alike, and each pair costs a lease expiry); the crash that matters most — a committed reply
# whose tools have not run — with kill -9.
@pytest.mark.parametrize(("point", "how"), [("before_model_call", "ray.kill"), ("after_model_commit", "kill -9")])
async def test_kill_member_mid_turn(runtime: Runtime, scope: Scope, how: str, point: str) -> None:
    # The member creates a grandchild and messages its parent: both side effects must happen once.
    member = script(call(create("g", script(say("g done"))),
                         ("send_message", {"target": "/root", "text": "hello once"})),
                    call(("wait_inputs", {"input_ids": ["$${0.input_id}"]})), say("member done $${2.results.0.output}"))
    text = script(call(create("fp-member", member)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("root got ${1.results.0.output}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    member_id = await eventually(lambda: _member(runtime, tree_id))
    await eventually(lambda: _owned_run(runtime, member_id))
    if point == "after_model_commit":
        await eventually(lambda: rows(runtime.db, "SELECT 1 FROM thread_messages WHERE session_id = %s "
                                      "AND role = 'assistant'", member_id))
    await asyncio.sleep(0.5)  # inside the 3 s pause
    await kill_session_process(runtime, member_id, how)
    result = await _assert_clean_finish(runtime, scope, tree_id, created["input"]["input_id"])
    assert (result["status"], result["output"]) == ("completed", "root got member done g done")
    grandchildren = await rows(runtime.db, "SELECT count(*) AS n FROM sessions WHERE parent_id = %s", member_id)
    messages = await rows(runtime.db, "SELECT count(*) AS n FROM coop_messages WHERE sender_session_id = %s",
                          member_id)
    assert grandchildren[0]["n"] == 1 and messages[0]["n"] == 1
    recovered = await rows(runtime.db, "SELECT count(*) AS n FROM runs WHERE session_id = %s AND status = "
                           "'interrupted' AND error LIKE 'lease expired%%'", member_id)
    assert recovered[0]["n"] >= 1


@pytest.mark.default_shape  # the gateway aborts it once the Run is over, whichever process it was in
async def test_the_model_call_of_a_killed_run_is_aborted_at_the_provider(runtime: Runtime, scope: Scope) -> None:
    """Ray does not cancel the call of a caller that died: the provider would answer it to its
    end (and bill it) while the resumed Run asks again. The gateway aborts it once it finds the
    calling process gone, before the Run's lease runs out (nobody else can take the reply)."""
    delay = 15.013  # a latency no other test's call has: this test's call is told apart by it
    text = script(call(create("slow", script(say("slow done", delay_ms=round(delay * 1000))))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("root got ${1.results.0.output}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    slow = await eventually(lambda: _member(runtime, tree_id, "/root/slow"))
    await eventually(lambda: _owned_run(runtime, slow))
    await eventually(lambda: model_calls_waiting(delay))  # the slow call is at the provider
    [killed] = await rows(runtime.db, "SELECT run_id FROM runs WHERE session_id = %s AND status = 'running'", slow)
    earlier = len(await model_gateway().scripted_hangups.remote())
    await kill_session_process(runtime, slow, "kill -9")
    result = await _assert_clean_finish(runtime, scope, tree_id, created["input"]["input_id"])
    assert (result["status"], result["output"]) == ("completed", "root got slow done")
    hangups = [h for h in (await model_gateway().scripted_hangups.remote())[earlier:] if h["delay_seconds"] == delay]
    assert len(hangups) == 1, hangups
    assert hangups[0]["after_seconds"] < delay - 3, hangups
    # Aborted for its caller's death, recorded before the sweeper recovered the Run (its lease, 4 s
    # here, ran out): not later, when the Run was found over.
    [call_row] = await rows(runtime.db, "SELECT c.error, c.created_at < r.ended_at AS before_recovery "
                                        "FROM model_calls c JOIN runs r USING (run_id) WHERE c.run_id = %s",
                            killed["run_id"])
    assert call_row == {"error": CALLER_GONE, "before_recovery": True}, call_row


async def _member(runtime: Runtime, tree_id: uuid.UUID, path: str = "/root/fp-member") -> uuid.UUID | None:
    found = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = %s", tree_id, path)
    return found[0]["session_id"] if found else None


@pytest.mark.session_kills
async def test_kill_root_during_wait(runtime: Runtime, scope: Scope, how: str) -> None:
    text = script(call(create("a", script(say("a done", delay_ms=2000)))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("root saw ${1.results.0.output}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM turns WHERE session_id = %s AND status = 'waiting'",
                                  tree_id))
    await kill_session_process(runtime, tree_id, how)
    result = await _assert_clean_finish(runtime, scope, tree_id, created["input"]["input_id"])
    assert result["output"] == "root saw a done"
    children = await rows(runtime.db, "SELECT count(*) AS n FROM sessions WHERE parent_id = %s", tree_id)
    assert children[0]["n"] == 1


async def test_kill_supervisor_mid_grant(runtime: Runtime, scope: Scope) -> None:
    names = [f"c{i}" for i in range(6)]
    text = script(call(*(create(n, script(say(n, delay_ms=800))) for n in names)),
                  call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(6)]})), say("done"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    for _ in range(4):  # kill it repeatedly while children queue for slots
        await asyncio.sleep(0.7)
        try:
            ray.kill(runtime.placement.supervisor_actor(tree_id), no_restart=True)
        except ValueError:
            pass  # between incarnations
    result = await _assert_clean_finish(runtime, scope, tree_id, created["input"]["input_id"])
    assert result["output"] == "done"
    children = await rows(runtime.db, "SELECT count(*) AS n FROM sessions WHERE parent_id = %s", tree_id)
    assert children[0]["n"] == 6


async def test_passivation_and_reactivation_with_full_history(runtime: Runtime, scope: Scope) -> None:
    text = script(call(create("kid", script(say("first answer")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("done"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    kid = await session_id_at(runtime.db, tree_id, "/root/kid")

    async def none_alive() -> bool:
        return all([await runtime.placement.session_status(session_id) is None for session_id in (tree_id, kid)])

    await eventually(none_alive, timeout=40, every=1.0)
    receipt = await runtime.submit_input(scope, kid, script(say("second answer")))
    second = await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    assert second["output"] == "second answer"
    history = await rows(runtime.db, "SELECT role, content FROM thread_messages WHERE session_id = %s ORDER BY id",
                         kid)
    assert [m["content"] for m in history if m["role"] == "assistant"] == ["first answer", "second answer"]


async def test_an_idle_session_and_supervisor_passivate_after_their_database_connections_died(
        runtime: Runtime, scope: Scope) -> None:
    """A database that restarted (or a network that dropped) kills the pooled connections, and each
    process's next use of one fails. The idle loops of a session and of its tree's supervisor died
    on it, and with no further hint their processes stayed for ever (dedicated: ~110 MB each). They
    log it and look again; idle, they passivate."""
    if not isinstance(runtime.placement, Dedicated):
        pytest.skip("the hosted shape's sessions and supervisors live in long-lived hosts")
    # More children than slots: one waits for a slot, which the tree's supervisor actor grants.
    children = 5
    created = await runtime.create_root(scope, input_text=script(
        call(*(create(f"c{i}", script(say(f"c{i} done"))) for i in range(children))),
        call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(children)]})), say("done")))
    tree_id = created["session"]["session_id"]
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "done"
    names = [session_actor_name(tree_id), tree_actor_name(tree_id)]

    async def alive() -> list[Any]:
        found = await asyncio.to_thread(list_actors, address=ray.get_runtime_context().gcs_address,
                                        filters=[("state", "=", "ALIVE")], limit=10_000)
        return [actor for actor in found if actor.name in names]

    async def all_alive() -> list[Any] | None:
        found = await alive()
        return found if len(found) == len(names) else None

    processes = await eventually(all_alive, timeout=30)
    terminated = await rows(runtime.db, "SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity "
                            "WHERE application_name = ANY(%s)", [f"canopy-{actor.pid}" for actor in processes])
    assert len(terminated) >= len(names) and all(row["done"] for row in terminated), terminated

    async def gone() -> bool:
        return not await alive()

    await eventually(gone, timeout=60)


async def test_a_session_process_that_answers_nothing_holds_up_no_other_trees_recovery(
        runtime: Runtime, scope: Scope) -> None:
    # The sweeper activates the sessions whose granted Runs no process took. One whose process is
    # alive but answers nothing (stopped, swapping, deadlocked: Ray restarts only dead ones) held
    # each sweep round up for the hint's 30 s timeout, and with it every other tree's recovery.
    stuck_text = script(say("first"))
    stuck = (await a_root_in_host(runtime, scope, 1, stuck_text) if isinstance(runtime.placement, Hosted)
             else await runtime.create_root(scope, input_text=stuck_text))
    stuck_id = stuck["session"]["session_id"]
    assert (await runtime.wait_result(scope, stuck["input"]["input_id"], timeout=60))["output"] == "first"
    status = await runtime.placement.session_status(stuck_id)
    assert status is not None, "the session stays live while idle"
    pid = int(status["pid"])
    healthy_text = script(say("slow", delay_ms=8_000))  # alive until its lease is taken away below
    healthy = (await a_root_in_host(runtime, scope, 0, healthy_text) if isinstance(runtime.placement, Hosted)
               else await runtime.create_root(scope, input_text=healthy_text))
    healthy_id = healthy["session"]["session_id"]
    await eventually(lambda: _owned_run(runtime, healthy_id))
    os.kill(pid, signal.SIGSTOP)
    try:
        again = await runtime.submit_input(scope, stuck_id, script(say("second")))
        await eventually(lambda: rows(runtime.db, "SELECT 1 FROM runs WHERE session_id = %s AND status = 'running' "
                                      "AND owner IS NULL", stuck_id))  # granted; nobody can take it
        await asyncio.sleep(2)  # a few sweep rounds: each one asks the stopped process to take it
        async with runtime.db.tx() as conn:  # the healthy tree's Run dies (its lease runs out now)
            await conn.execute("UPDATE runs SET lease_expires_at = now() WHERE session_id = %s "
                               "AND status = 'running'", (healthy_id,))
        resumed = await eventually(lambda: rows(runtime.db, "SELECT 1 FROM runs WHERE session_id = %s "
                                                "AND kind = 'resume'", healthy_id), timeout=10)
        assert resumed, "the healthy tree's dead Run is recovered while the other process answers nothing"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (await runtime.wait_result(scope, again["input_id"], timeout=90))["output"] == "second"
    assert (await runtime.wait_result(scope, healthy["input"]["input_id"], timeout=90))["output"] == "slow"
