"""The tree inbox answers bounded summaries: a tree of 1,000 members each asking to approve a
100,000-character command is not 100 MB per read. A request's whole payload is read from its own
session's requests (at most one pending), which is where a human approves it from."""

from __future__ import annotations

import urllib.parse

import httpx

from actors.runtime import Runtime
from actors.scripted import call, say, script
from tests.api.helpers import poll, rows

_PART = "#" * 500  # the agent's description: list_agents shows its first 500 characters
_TAIL = "x" * 490 + "END-MARKER"
# 100,000 characters once the references expand (an Input holds at most 100,000 characters).
_LONG = "${0.agents.0.description}" * 199 + _TAIL
COMMAND = _PART * 199 + _TAIL


async def _ask_agent(http: httpx.AsyncClient) -> None:
    agent = await http.post("/api/v1/agents", json={"agent_id": "wary", "name": "Wary", "model": "canopy/scripted",
                                                    "approval_mode": "ask", "description": _PART})
    assert agent.status_code == 201, agent.text


async def _pending(http: httpx.AsyncClient, tree_id: str, count: int = 1) -> list[dict]:
    async def inbox() -> list[dict] | None:
        found = (await http.get(f"/api/v1/trees/{tree_id}/requests")).json()
        return found if len(found) >= count else None

    return await poll(inbox, timeout=60)


async def test_the_tree_inbox_cuts_a_long_command_and_its_session_holds_all_of_it(http: httpx.AsyncClient,
                                                                                 runtime: Runtime) -> None:
    await _ask_agent(http)
    assert len(COMMAND) == 100_000
    text = script(call(("list_agents", {})), call(("run_command", {"command": _LONG})), say("denied"))
    created = (await http.post("/api/v1/sessions", json={"agent_id": "wary", "input": text})).json()
    tree_id = root_id = created["session"]["session_id"]
    (summary,) = await _pending(http, tree_id)

    stored = await rows(runtime.db, "SELECT request_id, payload FROM requests WHERE tree_id = %s", tree_id)
    assert [r["payload"]["command"] for r in stored] == [COMMAND]
    assert summary["id"] == str(stored[0]["request_id"])
    assert (summary["kind"], summary["session_id"], summary["path"], summary["status"]) == \
        ("approval", root_id, "/root", "pending")
    assert summary["truncated"] is True
    payload = summary["payload"]
    assert payload["command"] == COMMAND[:500]
    assert payload["command_chars"] == 100_000
    assert payload["tool"] == "run_command" and "tool_call_id" in payload  # short fields stay whole
    assert not any(key.endswith("_chars") for key in payload if key != "command_chars")

    inbox = await http.get(f"/api/v1/trees/{tree_id}/requests")
    assert len(inbox.content) < 5_000, len(inbox.content)
    assert "link" not in inbox.headers

    (whole,) = (await http.get(f"/api/v1/sessions/{root_id}/requests")).json()
    assert whole["id"] == summary["id"] and whole["truncated"] is False
    assert whole["payload"]["command"] == COMMAND and whole["payload"]["command"].endswith("END-MARKER")
    assert "command_chars" not in whole["payload"]

    denied = await http.post(f"/api/v1/requests/{summary['id']}/answer", json={"decision": "deny"})
    assert denied.status_code == 200, denied.text
    assert (await http.get(f"/api/v1/trees/{tree_id}/requests")).json() == []


async def test_a_short_request_is_whole_in_the_inbox(http: httpx.AsyncClient) -> None:
    """Nothing to cut: the summary is the request, and ``truncated`` is false."""
    await _ask_agent(http)
    text = script(call(("run_command", {"command": "echo short"})), say("done"))
    created = (await http.post("/api/v1/sessions", json={"agent_id": "wary", "input": text})).json()
    tree_id = created["session"]["session_id"]
    (summary,) = await _pending(http, tree_id)
    assert summary["truncated"] is False
    assert summary["payload"]["command"] == "echo short" and "command_chars" not in summary["payload"]
    assert (await http.get(f"/api/v1/sessions/{tree_id}/requests")).json() == [summary]
    await http.post(f"/api/v1/requests/{summary['id']}/answer", json={"decision": "deny"})


async def test_the_inbox_is_paged_oldest_first_with_a_link(http: httpx.AsyncClient) -> None:
    """At most ``limit`` (by default and at most 1,000: a tree's member limit) requests, oldest
    first; while more follow, a ``Link: <…>; rel="next"`` header gives the next page."""
    await _ask_agent(http)
    asker = script(call(("ask_user", {"question": "which one?"})), say("ok"))
    text = script(call(("create_session", {"name": "kid", "description": asker})),
                  call(("run_command", {"command": "echo root"})), say("done"))
    created = (await http.post("/api/v1/sessions", json={"agent_id": "wary", "input": text})).json()
    tree_id = created["session"]["session_id"]
    both = await _pending(http, tree_id, count=2)
    assert [r["created_at"] for r in both] == sorted(r["created_at"] for r in both)

    first = await http.get(f"/api/v1/trees/{tree_id}/requests", params={"limit": 1})
    assert first.status_code == 200 and first.json() == both[:1]
    target, rel = first.headers["link"].split(";")
    assert rel.strip() == 'rel="next"' and target.startswith("<requests?") and target.endswith(">")
    query = urllib.parse.parse_qs(target[len("<requests?"):-1])
    assert query == {"limit": ["1"], "after": [both[0]["id"]]}
    following = await http.get(f"/api/v1/trees/{tree_id}/requests?limit=1&after={both[0]['id']}")
    assert following.json() == both[1:] and "link" not in following.headers
    assert (await http.get(f"/api/v1/trees/{tree_id}/requests", params={"limit": 1001})).status_code == 422
    for request in both:
        body = {"decision": "deny"} if request["kind"] == "approval" else {"answer": "none"}
        assert (await http.post(f"/api/v1/requests/{request['id']}/answer", json=body)).status_code == 200
