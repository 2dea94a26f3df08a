"""Deadlock detection end to end: a model whose wait would close a cycle gets a typed tool error
with the cycle's path at once (no hang until the timeouts), and the tree still finishes."""

from __future__ import annotations

import json
import uuid

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.databases import rows
from persistence.records import Scope


async def _deadlock_errors(runtime: Runtime, tree_id: object) -> list[dict[str, object]]:
    found = await rows(runtime.db, "SELECT m.content FROM thread_messages m JOIN sessions s USING (session_id) "
                       "WHERE s.tree_id = %s AND m.role = 'tool'", tree_id)
    results = [json.loads(r["content"]) for r in found]
    return [r for r in results if isinstance(r, dict) and r.get("error_type") == "deadlock"]


async def test_a_child_and_its_parent_waiting_for_each_other(runtime: Runtime, scope: Scope) -> None:
    # The root waits for the child's input; the child waits for any update of the root. Whichever
    # waits second closes the cycle and is told so; the other then resumes when it ends.
    child = script(call(("wait_sessions", {"targets": ["/root"], "timeout_seconds": 600})), say("child done"))
    text = script(call(create("c", child)),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"], "timeout_seconds": 600})), say("root done"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "root done"
    await runtime.wait_tree_idle(scope, tree_id, timeout=60)
    refused = await _deadlock_errors(runtime, tree_id)
    assert len(refused) == 1
    assert refused[0]["cycle"] in (["/root/c", "/root", "/root/c"], ["/root", "/root/c", "/root"])


async def test_waiting_for_ones_own_queued_input(runtime: Runtime, scope: Scope) -> None:
    text = script(call(("submit_input", {"target": "/root", "text": script(say("later"))})),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("${1.error_type} ${1.cycle}"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "deadlock [\"/root\", \"/root\"]"


async def test_a_diamond_waits_and_finishes(runtime: Runtime, scope: Scope) -> None:
    # a and b both wait for d's input; the root waits for a and b: no cycle, everyone finishes.
    # ${0.input_id} is d's, filled in by the root's step; $${...} is left for the waiter's own step.
    waiter = script(call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("saw $${0.results.0.output}"))
    text = script(call(create("d", script(say("d done", delay_ms=1000)))),
                  call(create("a", waiter), create("b", waiter)),
                  call(("wait_inputs", {"input_ids": ["${1.input_id}", "${2.input_id}"]})),
                  say("${3.results.0.output}|${3.results.1.output}"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"] == "saw d done|saw d done"
    assert await _deadlock_errors(runtime, created["session"]["session_id"]) == []


async def test_a_wait_already_satisfied_in_the_same_step_is_no_cycle(runtime: Runtime, scope: Scope) -> None:
    # The root waits for any update of the child. In one reply the child sends the root a message
    # (an update: the root's wait is satisfied, and resumes once this step commits) and waits for
    # the root. The root's wait was still open when the child's wait was checked: it was walked as
    # stuck, and the child was told it would deadlock. The root's end is the child's update.
    child = script(call(("send_message", {"target": "/root", "text": "ping"}),
                        ("wait_sessions", {"targets": ["/root"], "timeout_seconds": 600}), delay_ms=1500),
                   say("child saw $${1.updates.0.kind}"))
    text = script(call(create("c", child)),
                  call(("wait_sessions", {"targets": ["/root/c"], "timeout_seconds": 600})),
                  say("${0.input_id} ${1.updates.0.kind}"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    child_input, seen = result["output"].split()
    assert seen == "coop_message"
    child_result = await runtime.wait_result(scope, uuid.UUID(child_input), timeout=60)
    assert (child_result["status"], child_result["output"]) == ("completed", "child saw turn_completed")
    assert await _deadlock_errors(runtime, created["session"]["session_id"]) == []
