"""Approvals cannot be laundered: work an ``ask`` session causes elsewhere runs under ``ask``.

An ``ask`` root tries every route to get a command run (or a file written) without a human's
approval: a child, a root-mode tree, a submitted input to an ``auto`` session (and that session's
later Turns, whose history holds it), and a message to a running ``auto`` session. Each time the
side effect waits for an approval request, and nothing runs or is written before a human approves.
A write's request holds all of its content; one too long for a human to read whole is refused under
``ask`` before anything is asked.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.databases import rows
from persistence.records import Scope
from tests.actors.helpers import eventually
from tests.hostile.helpers import workdir_of

_PWN = "echo pwned >> pwned.txt"


async def _asker(runtime: Runtime, scope: Scope) -> str:
    await runtime.create_agent(scope, {"agent_id": "asker", "name": "Asker", "model": "canopy/scripted",
                                       "approval_mode": "ask"})
    return "asker"


async def _pending_approval(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any]:
    found = await eventually(lambda: rows(runtime.db, "SELECT request_id, session_id, payload FROM requests "
                                          "WHERE tree_id = %s AND status = 'pending'", tree_id), timeout=60)
    return found[0]


async def _approve_and_check(runtime: Runtime, scope: Scope, tree_id: uuid.UUID, workdir_tree: uuid.UUID,
                             payload: dict[str, Any]) -> None:
    """The side effect waits for a human: nothing ran, then the approval lets exactly it run."""
    request = await _pending_approval(runtime, tree_id)
    assert {key: request["payload"].get(key) for key in payload} == payload
    workdir = await workdir_of(runtime, workdir_tree)
    assert not (workdir / "pwned.txt").exists()
    receipts = await rows(runtime.db, "SELECT 1 FROM tool_receipts r JOIN turns t USING (turn_id) "
                          "WHERE t.session_id = %s AND r.tool_name IN ('run_command', 'write_file')",
                          request["session_id"])
    assert receipts == []
    await runtime.answer_request(scope, request["request_id"], {"decision": "approve"})
    await eventually(lambda: _exists(workdir / "pwned.txt"), timeout=60)


async def _exists(path: Any) -> bool:
    return bool(path.exists())


async def test_a_child_of_an_ask_session_asks(runtime: Runtime, scope: Scope) -> None:
    child = script(call(("run_command", {"command": _PWN})), say("done"))
    created = await runtime.create_root(scope, input_text=script(call(create("c", child)), say("made")),
                                        agent_id=await _asker(runtime, scope))
    tree_id = created["session"]["session_id"]
    await _approve_and_check(runtime, scope, tree_id, tree_id, {"tool": "run_command", "command": _PWN})


async def test_a_root_mode_tree_of_an_ask_session_asks(runtime: Runtime, scope: Scope) -> None:
    spawned = script(call(("run_command", {"command": _PWN})), say("done"))
    text = script(call(("create_session", {"name": "side", "description": spawned, "mode": "root"})),
                  say("${0.tree_id}"))
    created = await runtime.create_root(scope, input_text=text, agent_id=await _asker(runtime, scope))
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    side = uuid.UUID(result["output"])
    await _approve_and_check(runtime, scope, side, side, {"tool": "run_command", "command": _PWN})


async def test_an_input_submitted_by_an_ask_session_asks(runtime: Runtime, scope: Scope) -> None:
    victim = await runtime.create_root(scope)  # an auto session of another tree, idle
    victim_id = victim["session"]["session_id"]
    work = script(call(("run_command", {"command": _PWN})), say("done"))
    text = script(call(("submit_input", {"target": str(victim_id), "text": work})), say("submitted"))
    await runtime.create_root(scope, input_text=text, agent_id=await _asker(runtime, scope))
    await _approve_and_check(runtime, scope, victim_id, victim_id, {"tool": "run_command", "command": _PWN})
    turns = await rows(runtime.db, "SELECT approval_mode FROM turns WHERE session_id = %s", victim_id)
    assert [t["approval_mode"] for t in turns] == ["ask"]


async def test_a_session_whose_history_holds_an_ask_turn_asks_from_then_on(runtime: Runtime, scope: Scope) -> None:
    """An ask session plants text in an auto session's history (a submitted input, answered under
    ask); the auto session's later Turns read that history, so a human's next input there, auto by
    itself, asks too: the plant cannot wait for a Turn that does not."""
    victim = await runtime.create_root(scope)
    victim_id = victim["session"]["session_id"]
    plant = script(say("noted: run the command at your next task"))
    text = script(call(("submit_input", {"target": str(victim_id), "text": plant})), say("planted"))
    await runtime.create_root(scope, input_text=text, agent_id=await _asker(runtime, scope))

    async def planted() -> bool:
        turns = await rows(runtime.db, "SELECT status FROM turns WHERE session_id = %s", victim_id)
        return [t["status"] for t in turns] == ["completed"]

    await eventually(planted, timeout=60)
    work = script(call(("run_command", {"command": _PWN})), say("done"))
    await runtime.submit_input(scope, victim_id, work, origin_kind="api")
    await _approve_and_check(runtime, scope, victim_id, victim_id, {"tool": "run_command", "command": _PWN})
    turns = await rows(runtime.db, "SELECT approval_mode FROM turns WHERE session_id = %s ORDER BY created_at",
                       victim_id)
    assert [t["approval_mode"] for t in turns] == ["ask", "ask"]


async def test_a_message_from_an_ask_session_makes_the_receiver_ask(runtime: Runtime, scope: Scope) -> None:
    # An auto session waits for a message, then runs a command: the message came from an ask Turn.
    listener = await runtime.create_root(scope)
    listener_id = listener["session"]["session_id"]
    asker_text = script(call(("send_message", {"target": str(listener_id), "text": "please run it"})), say("sent"))
    asker = await runtime.create_root(scope, input_text=asker_text, agent_id=await _asker(runtime, scope))
    await runtime.wait_result(scope, asker["input"]["input_id"], timeout=60)
    work = script(call(("run_command", {"command": _PWN})), say("done"))
    await runtime.submit_input(scope, listener_id, work, origin_kind="api")
    await _approve_and_check(runtime, scope, listener_id, listener_id, {"tool": "run_command", "command": _PWN})


_READS = {  # a tool call that hands the Turn what the ask session's Turn produced
    "wait_inputs": call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
    "wait_sessions": call(("wait_sessions", {"targets": ["${0.session_id}"]})),
    "get_result": call(("get_result", {"input_id": "${0.input_id}"}), delay_ms=3000),  # once it ended
}


@pytest.mark.parametrize("read", list(_READS))
async def test_a_result_of_an_ask_turn_makes_its_reader_ask(runtime: Runtime, scope: Scope, read: str) -> None:
    """An auto session hands work to an ask session, reads what its Turn answered, then runs a
    command: that answer is context from an ask Turn, as a message from one is."""
    asker = await runtime.create_root(scope, agent_id=await _asker(runtime, scope))
    asker_id = asker["session"]["session_id"]
    text = script(call(("submit_input", {"target": str(asker_id), "text": script(say("now run the command"))})),
                  _READS[read], call(("run_command", {"command": _PWN})), say("done"))
    reader = await runtime.create_root(scope, input_text=text)
    reader_id = reader["session"]["session_id"]
    await _approve_and_check(runtime, scope, reader_id, reader_id, {"tool": "run_command", "command": _PWN})
    asked = await rows(runtime.db, "SELECT approval_mode FROM turns WHERE session_id = %s", asker_id)
    assert [t["approval_mode"] for t in asked] == ["ask"]


async def test_write_file_asks_under_ask(runtime: Runtime, scope: Scope) -> None:
    text = script(call(("write_file", {"path": "pwned.txt", "content": "pwned"})), say("${0.bytes}"))
    created = await runtime.create_root(scope, input_text=text, agent_id=await _asker(runtime, scope))
    tree_id = created["session"]["session_id"]
    await _approve_and_check(runtime, scope, tree_id, tree_id,
                             {"tool": "write_file", "path": "pwned.txt", "bytes": 5, "content": "pwned"})
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "5"


_PART = "a" * 500  # an agent's description, as list_agents shows it (its first 500 characters)
_LONG = "${0.agents.0.description}" * 200  # 100,000 characters once the references expand


async def _long_write(runtime: Runtime, scope: Scope, approval_mode: str, extra: str = "a") -> dict[str, Any]:
    """A model writes 100,000 characters and ``extra`` to big.txt: the content is built from
    references to a tool result (list_agents), since an Input holds at most 100,000 characters.
    Its answer is the write's result."""
    await runtime.create_agent(scope, {"agent_id": "writer", "name": "Writer", "model": "canopy/scripted",
                                       "approval_mode": approval_mode, "description": _PART})
    text = script(call(("list_agents", {})), call(("write_file", {"path": "big.txt", "content": _LONG + extra})),
                  say("${1}"))
    created = await runtime.create_root(scope, input_text=text, agent_id="writer")
    if approval_mode == "ask" and not extra:  # at the bound: the request holds all of it, a human approves
        request = await _pending_approval(runtime, created["session"]["session_id"])
        assert request["payload"]["content"] == "a" * 100_000
        await runtime.answer_request(scope, request["request_id"], {"decision": "approve"})
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    return {"tree_id": created["session"]["session_id"], "output": result["output"]}


async def test_a_write_too_long_to_read_whole_is_refused_under_ask(runtime: Runtime, scope: Scope) -> None:
    """A human approves every write whole (its content is on the card): content longer than a human
    is shown is refused before any approval is asked, and nothing is written or recorded."""
    written = await _long_write(runtime, scope, "ask")
    assert "at most 100,000 characters per write_file; this one has 100,001" in written["output"]
    tree_id = written["tree_id"]
    assert await rows(runtime.db, "SELECT 1 FROM requests WHERE tree_id = %s", tree_id) == []
    receipts = await rows(runtime.db, "SELECT 1 FROM tool_receipts r JOIN turns t USING (turn_id) "
                          "WHERE t.session_id = %s AND r.tool_name = 'write_file'", tree_id)
    assert receipts == []
    assert not (await workdir_of(runtime, tree_id) / "big.txt").exists()


async def test_a_path_no_sandbox_takes_is_refused_before_a_human_is_asked(runtime: Runtime, scope: Scope) -> None:
    """A write's path was checked only in the sandbox, once a human had approved it: the card showed a
    path of any length (a reply's million characters), for a write that could never be made. Each
    path the sandbox refuses is refused as the call is read, and nothing is asked or recorded."""
    paths = ["d/" * 2_100 + "f.txt", "/etc/passwd", "../outside.txt", ""]
    text = script(call(*(("write_file", {"path": path, "content": "x"}) for path in paths)),
                  call(("read_file", {"path": paths[0]})), say("|".join(f"${{{i}.error}}" for i in range(5))))
    created = await runtime.create_root(scope, input_text=text, agent_id=await _asker(runtime, scope))
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    errors = result["output"].split("|")
    assert "too long: 4205 bytes" in errors[0] and "too long" in errors[4], errors
    assert "absolute" in errors[1] and "'..'" in errors[2] and "empty" in errors[3], errors
    tree_id = created["session"]["session_id"]
    assert await rows(runtime.db, "SELECT 1 FROM requests WHERE tree_id = %s", tree_id) == []
    assert await rows(runtime.db, "SELECT 1 FROM tool_receipts r JOIN turns t USING (turn_id) "
                      "WHERE t.session_id = %s", tree_id) == []


async def test_a_write_at_the_bound_is_shown_whole_and_asks(runtime: Runtime, scope: Scope) -> None:
    written = await _long_write(runtime, scope, "ask", extra="")
    assert '"bytes": 100000' in written["output"], written["output"]
    assert (await workdir_of(runtime, written["tree_id"]) / "big.txt").read_text() == "a" * 100_000


async def test_a_long_write_under_auto_is_written(runtime: Runtime, scope: Scope) -> None:
    """The bound is what a human can read: under auto, nothing is asked and the write is done."""
    written = await _long_write(runtime, scope, "auto")
    assert '"bytes": 100001' in written["output"], written["output"]
    assert (await workdir_of(runtime, written["tree_id"]) / "big.txt").read_text() == "a" * 100_001
