"""Human in the loop and a human's actions over HTTP: questions, approvals, steer, cancel, stop/continue."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from tests.api.helpers import poll, rows


async def _result(http: httpx.AsyncClient, input_id: str, timeout: float = 60.0) -> dict:
    async def terminal() -> dict | None:
        result = (await http.get(f"/api/v1/inputs/{input_id}/result")).json()
        return result if result["terminal"] else None

    return await poll(terminal, timeout=timeout)


async def test_question_in_tree_inbox_answered_over_http(http: httpx.AsyncClient) -> None:
    asker = script(call(("ask_user", {"question": "favourite colour?"})), say("answer was $${0.answer}"))
    text = script(call(create("kid", asker)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("kid said ${1.results.0.output}"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    tree_id = created["session"]["tree_id"]

    async def inbox() -> list:
        return (await http.get(f"/api/v1/trees/{tree_id}/requests")).json()

    requests = await poll(inbox)
    request = requests[0]
    assert (request["kind"], request["path"], request["status"]) == ("question", "/root/kid", "pending")
    assert request["payload"] == {"question": "favourite colour?"}
    kid_id = request["session_id"]
    assert (await http.get(f"/api/v1/sessions/{kid_id}/requests")).json() == requests
    assert (await http.get(f"/api/v1/sessions/{tree_id}/requests")).json() == []
    kid = (await http.get(f"/api/v1/sessions/{kid_id}")).json()
    assert (kid["activity"], kid["current_turn_id"]) == ("waiting_answer", request["turn_id"])

    # While it waits for a human, the session takes no new work and has no running Turn to steer.
    refused = await http.post(f"/api/v1/sessions/{kid_id}/inputs", json={"text": "more work"})
    assert refused.status_code == 409 and "waiting for a human" in refused.json()["detail"]
    assert (await http.post(f"/api/v1/sessions/{kid_id}/steer", json={"text": "hurry"})).status_code == 409
    wrong_kind = await http.post(f"/api/v1/requests/{request['id']}/answer", json={"decision": "approve"})
    assert wrong_kind.status_code == 422
    both = await http.post(f"/api/v1/requests/{request['id']}/answer", json={"decision": "approve", "answer": "x"})
    assert both.status_code == 422

    answered = await http.post(f"/api/v1/requests/{request['id']}/answer", json={"answer": "blue"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "answered"
    again = await http.post(f"/api/v1/requests/{request['id']}/answer", json={"answer": "red"})
    assert again.status_code == 409
    result = await _result(http, created["input"]["input_id"])
    assert (result["status"], result["output"]) == ("completed", "kid said answer was blue")
    assert await inbox() == []


async def test_approval_over_http(http: httpx.AsyncClient) -> None:
    agent = await http.post("/api/v1/agents", json={"agent_id": "careful", "name": "Careful", "approval_mode": "ask"})
    assert agent.status_code == 201
    text = script(call(("run_command", {"command": "echo approved-run"})), say("${0.stdout}"))
    created = (await http.post("/api/v1/sessions", json={"input": text, "agent_id": "careful"})).json()
    tree_id = created["session"]["tree_id"]
    requests = await poll(lambda: _json(http, f"/api/v1/trees/{tree_id}/requests"))
    assert requests[0]["kind"] == "approval" and requests[0]["payload"]["command"] == "echo approved-run"
    assert (await http.post(f"/api/v1/requests/{requests[0]['id']}/answer",
                            json={"answer": "yes"})).status_code == 422
    answered = await http.post(f"/api/v1/requests/{requests[0]['id']}/answer", json={"decision": "approve"})
    assert answered.status_code == 200
    result = await _result(http, created["input"]["input_id"])
    assert result["output"] == "approved-run\n"


async def _json(http: httpx.AsyncClient, path: str) -> list:
    return (await http.get(path)).json()


async def test_steer_reaches_the_running_turn(http: httpx.AsyncClient, runtime: Runtime) -> None:
    text = script(call(("list_agents", {}), delay_ms=2500), say("done"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    session_id = created["session"]["session_id"]
    await poll(lambda: rows(runtime.db, "SELECT 1 FROM runs WHERE session_id = %s AND status = 'running' "
                            "AND owner IS NOT NULL", uuid.UUID(session_id)))
    steered = await http.post(f"/api/v1/sessions/{session_id}/steer", json={"text": "prefer short answers"})
    assert steered.status_code == 202, steered.text
    assert steered.json()["turn_id"] == created["input"]["turn_id"]
    await _result(http, created["input"]["input_id"])
    messages = (await http.get(f"/api/v1/sessions/{session_id}/messages")).json()
    steers = [m for m in messages if m["origin"].get("kind") == "steer"]
    assert len(steers) == 1 and "prefer short answers" in steers[0]["content"]
    idle = await http.post(f"/api/v1/sessions/{session_id}/steer", json={"text": "too late"})
    assert idle.status_code == 409


async def test_a_cancel_that_meets_a_deadlock_answers_409_and_changes_nothing(http: httpx.AsyncClient,
                                                                              runtime: Runtime) -> None:
    """PostgreSQL aborts one of two transactions that lock the same rows in opposite orders: the
    request's answered 500 with the server's details; it is a 409 that says to send it again."""
    created = (await http.post("/api/v1/sessions", json={"input": script(say("slow", delay_ms=20000))})).json()
    session_id, turn_id = created["session"]["session_id"], created["input"]["turn_id"]
    async with runtime.db.tx() as conn:
        await conn.execute("SELECT 1 FROM turns WHERE turn_id = %s FOR UPDATE", (turn_id,))
        holder = (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]
        cancelling = asyncio.create_task(http.post(f"/api/v1/sessions/{session_id}/turns/{turn_id}/cancel"))

        async def blocked() -> bool:  # the cancel holds the session's row and waits for the Turn's
            return bool(await rows(runtime.db, "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                   holder))

        await poll(blocked, timeout=30)
        await conn.execute("SELECT 1 FROM sessions WHERE session_id = %s FOR UPDATE", (session_id,))
    refused = await cancelling

    assert refused.status_code == 409 and "send the request again" in refused.json()["detail"], refused.text
    assert await rows(runtime.db, "SELECT status FROM turns WHERE turn_id = %s", turn_id) == [{"status": "running"}]
    again = await http.post(f"/api/v1/sessions/{session_id}/turns/{turn_id}/cancel")
    assert again.status_code == 202, again.text
    assert (await _result(http, created["input"]["input_id"], timeout=30))["status"] == "cancelled"


async def test_cancel_turn_and_queued_input(http: httpx.AsyncClient) -> None:
    created = (await http.post("/api/v1/sessions", json={"input": script(say("slow", delay_ms=20000))})).json()
    session_id = created["session"]["session_id"]
    queued = await http.post(f"/api/v1/sessions/{session_id}/inputs", json={"text": script(say("second"))})
    assert queued.status_code == 202 and queued.json()["status"] == "queued"
    cancelled_input = await http.post(f"/api/v1/inputs/{queued.json()['input_id']}/cancel")
    assert cancelled_input.status_code == 200 and cancelled_input.json()["status"] == "cancelled"
    consumed = await http.post(f"/api/v1/inputs/{created['input']['input_id']}/cancel")
    assert consumed.status_code == 409
    turn_id = created["input"]["turn_id"]
    accepted = await http.post(f"/api/v1/sessions/{session_id}/turns/{turn_id}/cancel")
    assert accepted.status_code == 202 and accepted.json() == {"status": "accepted", "session_id": session_id,
                                                               "turn_id": turn_id}
    result = await _result(http, created["input"]["input_id"], timeout=30)
    assert result["status"] == "cancelled"
    queued_result = (await http.get(f"/api/v1/inputs/{queued.json()['input_id']}/result")).json()
    assert (queued_result["status"], queued_result["terminal"], queued_result["turn_id"]) == ("cancelled", True, None)


async def test_stop_and_continue_over_http(http: httpx.AsyncClient) -> None:
    text = script(call(create("a", script(say("a", delay_ms=30000)))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("never"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    tree_id = created["session"]["tree_id"]

    async def child_running() -> bool:
        members = (await http.get(f"/api/v1/trees/{tree_id}")).json()["members"]
        return any(m["path"] == "/root/a" and m["activity"] == "running" for m in members)

    await poll(child_running)
    refused = await http.post(f"/api/v1/trees/{tree_id}/continue")
    assert refused.status_code == 409
    stopped = await http.post(f"/api/v1/trees/{tree_id}/stop")
    assert stopped.status_code == 202 and stopped.json()["tree_id"] == tree_id

    async def all_ended() -> dict | None:
        summary = (await http.get(f"/api/v1/trees/{tree_id}")).json()
        done = all(m["turn_status"] in ("completed", "failed", "cancelled") for m in summary["members"])
        return summary if done else None

    summary = await poll(all_ended, timeout=30)
    assert summary["stopped"] is True
    assert {m["turn_status"] for m in summary["members"]} == {"cancelled"}
    continued = await http.post(f"/api/v1/trees/{tree_id}/continue")
    assert continued.status_code == 202 and continued.json()["status"] == "continued"
    assert (await http.get(f"/api/v1/trees/{tree_id}")).json()["stopped"] is False
    # An archived tree is not continued (SPEC §7): archived after a second stop, it stays stopped.
    assert (await http.post(f"/api/v1/trees/{tree_id}/stop")).status_code == 202
    assert (await http.post(f"/api/v1/sessions/{tree_id}/archive")).status_code == 200
    refused = await http.post(f"/api/v1/trees/{tree_id}/continue")
    assert refused.status_code == 409 and "archived" in refused.json()["detail"]
    assert (await http.get(f"/api/v1/trees/{tree_id}")).json()["stopped"] is True
