"""Context compaction end to end: a long session keeps answering while what it sends the model stays
bounded, the original messages stay, and a kill -9 during compaction still leaves exactly one summary."""

from __future__ import annotations

import uuid

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.databases import rows
from persistence.records import Scope
from tests.actors.helpers import eventually, failing_once, kill_session_process

THRESHOLD = 2000  # tokens: about 8,000 characters of history


async def _summaries(runtime: Runtime, session_id: uuid.UUID) -> list[dict[str, object]]:
    return await rows(runtime.db, "SELECT id, content, origin FROM thread_messages WHERE session_id = %s "
                      "AND origin->>'kind' = 'compaction' ORDER BY id", session_id)


async def test_a_300_turn_session_compacts_and_keeps_answering(runtime: Runtime, scope: Scope) -> None:
    await runtime.create_agent(scope, {"agent_id": "talker", "name": "Talker", "model": "canopy/scripted",
                                       "compact_at_tokens": THRESHOLD})
    created = await runtime.create_root(scope, agent_id="talker", title="long")
    session_id = created["session"]["session_id"]
    receipts = [await runtime.submit_input(scope, session_id, script(say(f"answer {n}"), task=f"{n} " + "x" * 1000))
                for n in range(300)]
    last = await runtime.wait_result(scope, receipts[-1]["input_id"], timeout=600)
    assert last["output"] == "answer 299"
    outputs = await rows(runtime.db, "SELECT r.output FROM turns t JOIN runs r ON r.run_id = t.result_run_id "
                         "WHERE t.session_id = %s ORDER BY t.created_at", session_id)
    assert [o["output"] for o in outputs] == [f"answer {n}" for n in range(300)]
    summaries = await _summaries(runtime, session_id)
    assert len(summaries) >= 10  # every ~8 Turns of ~1,000 characters
    # Every message stays: 300 inputs, 300 answers, and the summaries beside them.
    counted = await rows(runtime.db, "SELECT count(*) AS n FROM thread_messages WHERE session_id = %s", session_id)
    assert counted[0]["n"] == 600 + len(summaries)
    # What each call sent stays bounded; without compaction the last would send ~75,000 tokens.
    usage = await rows(runtime.db, "SELECT m.prompt_tokens FROM model_calls m JOIN runs r ON r.run_id = m.run_id "
                       "WHERE r.session_id = %s ORDER BY m.id", session_id)
    assert len(usage) >= 300
    assert max(u["prompt_tokens"] for u in usage[-100:]) < 2 * THRESHOLD


async def test_a_database_error_committing_a_summary_is_recovered_not_failed(runtime: Runtime, scope: Scope) -> None:
    # The summary is answered and its commit fails (a passing database error): that failed the Turn
    # as "model call failed". The Run is recovered instead, and the Turn goes on from the summary.
    created = await runtime.create_root(scope, input_text=script(say("first")))
    session = created["session"]["session_id"]
    await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    for n in range(3):  # some history to compact
        receipt = await runtime.submit_input(scope, session, script(say(f"more {n}"), task="y" * 500))
        await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    await runtime.request_compaction(scope, session)
    async with failing_once(runtime.db, "thread_messages",
                            f"NEW.session_id = '{session}' AND NEW.origin->>'kind' = 'compaction'"):
        receipt = await runtime.submit_input(scope, session, script(say("after the summary")))
        result = await runtime.wait_result(scope, receipt["input_id"], timeout=90)
    assert (result["status"], result["output"]) == ("completed", "after the summary"), result
    assert len(await _summaries(runtime, session)) == 1
    runs = await rows(runtime.db, "SELECT error FROM runs WHERE turn_id = %s ORDER BY queued_at", receipt["turn_id"])
    assert len(runs) == 2 and "lease expired" in runs[0]["error"]  # the first Run crashed and was recovered


async def test_a_kill_during_compaction_leaves_exactly_one_summary(runtime: Runtime, scope: Scope) -> None:
    text = script(call(create("fp-c", script(say("first")))), say("made"))
    created = await runtime.create_root(scope, input_text=text)
    await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    child = (await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = '/root/fp-c'",
                        created["session"]["session_id"]))[0]["session_id"]
    for n in range(3):  # some history to compact
        receipt = await runtime.submit_input(scope, child, script(say(f"more {n}"), task="y" * 500))
        await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    await runtime.request_compaction(scope, child)
    receipt = await runtime.submit_input(scope, child, script(say("after the summary")))

    async def compaction_answered() -> list[dict[str, object]]:
        return await rows(runtime.db, "SELECT m.id FROM model_calls m JOIN runs r ON r.run_id = m.run_id "
                          "WHERE r.turn_id = %s", receipt["turn_id"])

    await eventually(compaction_answered, timeout=30, every=0.05)  # the summary call is done; not committed
    await kill_session_process(runtime, child, "kill -9")
    result = await runtime.wait_result(scope, receipt["input_id"], timeout=90)
    assert result["output"] == "after the summary"
    summaries = await _summaries(runtime, child)
    assert len(summaries) == 1
    assert summaries[0]["origin"]["covered"] == 8  # the first input and answer, and three more of each
    requested = await rows(runtime.db, "SELECT compact_requested FROM sessions WHERE session_id = %s", child)
    assert requested == [{"compact_requested": False}]
