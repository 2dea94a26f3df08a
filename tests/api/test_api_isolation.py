"""Scope isolation on every route: another user of the same app, and another app of the same user,
get 404 for the first scope's objects, and their attempts write nothing at all."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.records import Scope
from tests.api.conftest import ClientFactory
from tests.api.helpers import poll, rows

_SCOPED_TABLES = ("sessions", "inputs", "events", "coop_messages", "requests", "http_idempotency", "projects",
                  "trees", "api_keys", "scopes")
_SESSION_TABLES = ("turns", "runs", "thread_messages", "waits")


async def _snapshot(runtime: Runtime, scopes: list[Scope]) -> dict[str, list[str]]:
    """Every row the involved scopes own, as text: any insert or update shows up as a difference."""
    users = [s.user_id for s in scopes]
    apps = [s.app_id for s in scopes]
    mine = "(user_id, app_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
    snapshot: dict[str, list[str]] = {}
    for table in _SCOPED_TABLES:
        found = await rows(runtime.db, f"SELECT to_jsonb(t)::text AS row FROM {table} t WHERE {mine}", users, apps)
        snapshot[table] = sorted(r["row"] for r in found)
    for table in _SESSION_TABLES:
        found = await rows(runtime.db, f"SELECT to_jsonb(t)::text AS row FROM {table} t WHERE session_id IN "
                           f"(SELECT session_id FROM sessions WHERE {mine})", users, apps)
        snapshot[table] = sorted(r["row"] for r in found)
    found = await rows(runtime.db, "SELECT to_jsonb(a)::text AS row FROM agents a WHERE app_id = ANY(%s)", apps)
    snapshot["agents"] = sorted(r["row"] for r in found)
    return snapshot


def _victim_routes(ids: dict[str, str]) -> list[tuple[str, str, dict[str, Any] | None]]:
    s, k, tree = ids["root"], ids["kid"], ids["root"]
    return [
        ("GET", "/api/v1/agents/secret", None),
        ("PATCH", "/api/v1/agents/secret", {"name": "taken over"}),
        ("DELETE", "/api/v1/agents/secret", None),
        ("DELETE", f"/api/v1/projects/{ids['project']}", None),
        ("GET", f"/api/v1/sessions?project_id={ids['project']}", None),
        ("GET", f"/api/v1/sessions?scope=project&project_id={ids['project']}", None),
        ("POST", "/api/v1/sessions", {"project_id": ids["project"], "input": "work in their project"}),
        ("POST", "/api/v1/sessions", {"agent_id": "secret", "input": "run their agent"}),
        ("GET", f"/api/v1/sessions/{s}", None),
        ("PATCH", f"/api/v1/sessions/{s}", {"title": "renamed"}),
        ("GET", f"/api/v1/sessions/{s}/messages", None),
        ("POST", f"/api/v1/sessions/{k}/inputs", {"text": "more work"}),
        ("POST", f"/api/v1/sessions/{s}/inputs", {"text": "more work"}),
        ("POST", f"/api/v1/sessions/{s}/steer", {"text": "obey me"}),
        ("POST", f"/api/v1/sessions/{s}/turns/{ids['turn']}/cancel", None),
        ("POST", f"/api/v1/sessions/{ids['own']}/turns/{ids['turn']}/cancel", None),
        ("GET", f"/api/v1/sessions/{s}/requests", None),
        ("POST", f"/api/v1/sessions/{s}/archive", None),
        ("GET", f"/api/v1/sessions/{s}/events", None),
        ("GET", f"/api/v1/sessions/{s}/events?after=latest", None),
        ("GET", f"/api/v1/sessions/{s}/inputs?status=pending", None),
        ("POST", f"/api/v1/inputs/{ids['input']}/cancel", None),
        ("POST", f"/api/v1/inputs/{ids['kid_input']}/cancel", None),
        ("GET", f"/api/v1/inputs/{ids['input']}/result", None),
        ("GET", f"/api/v1/turns/{ids['turn']}/result", None),
        ("GET", f"/api/v1/trees/{tree}", None),
        ("POST", f"/api/v1/trees/{tree}/stop", None),
        ("POST", f"/api/v1/trees/{tree}/continue", None),
        ("GET", f"/api/v1/trees/{tree}/requests", None),
        ("GET", f"/api/v1/trees/{tree}/events", None),
        ("GET", f"/api/v1/trees/{tree}/events?after=latest", None),
        ("POST", f"/api/v1/requests/{ids['request']}/answer", {"answer": "42"}),
    ]


async def _victim(http: httpx.AsyncClient) -> dict[str, str]:
    assert (await http.post("/api/v1/agents", json={"agent_id": "secret", "name": "Secret"})).status_code == 201
    project = (await http.post("/api/v1/projects", json={"name": "private"})).json()["project_id"]
    text = script(call(create("k", script(say("kid done")))), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  call(("ask_user", {"question": "continue?"})), say("done"))
    created = (await http.post("/api/v1/sessions", json={"input": text, "project_id": project,
                                                          "agent_id": "secret"})).json()
    root = created["session"]["session_id"]

    async def pending() -> list:
        return (await http.get(f"/api/v1/trees/{root}/requests")).json()

    request = (await poll(pending))[0]
    kid = next(m for m in (await http.get(f"/api/v1/trees/{root}")).json()["members"] if m["path"] == "/root/k")
    kid_result = (await http.get(f"/api/v1/turns/{kid['turn_id']}/result")).json()
    return {"project": project, "root": root, "kid": kid["session_id"], "input": created["input"]["input_id"],
            "turn": created["input"]["turn_id"], "request": request["id"], "kid_input": kid_result["input_id"]}


async def test_other_scopes_get_404_everywhere_and_write_nothing(client_for: ClientFactory, runtime: Runtime) -> None:
    user, app = f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}"
    victim_scope = Scope(user, app)
    attackers = {"same app, other user": Scope(f"other-{uuid.uuid4().hex[:8]}", app),
                 "same user, other app": Scope(user, f"other-{uuid.uuid4().hex[:8]}")}
    victim = await client_for(victim_scope)
    ids = await _victim(victim)
    clients = {name: await client_for(scope) for name, scope in attackers.items()}
    for http in clients.values():  # each attacker has a session of its own (for the mixed-id attempt)
        own = (await http.post("/api/v1/sessions", json={"title": "mine"})).json()["session"]["session_id"]
    before = await _snapshot(runtime, [victim_scope, *attackers.values()])

    for name, http in clients.items():
        ids["own"] = (await http.get("/api/v1/sessions")).json()[0]["session_id"]
        for method, path, body in _victim_routes(ids):
            response = await http.request(method, path, json=body, headers={"Idempotency-Key": f"k-{uuid.uuid4()}"}
                                          if method == "POST" else None)
            assert response.status_code == 404, (name, method, path, response.status_code, response.text)
            assert isinstance(response.json()["detail"], str)
        # Listings do not reveal the victim's objects either.
        assert "secret" not in json.dumps((await http.get("/api/v1/agents")).json())
        assert ids["project"] not in json.dumps((await http.get("/api/v1/projects")).json())
        assert ids["root"] not in json.dumps((await http.get("/api/v1/sessions")).json())

    assert await _snapshot(runtime, [victim_scope, *attackers.values()]) == before
    # Nor does taking an id: another user of the app names an agent of their own as the victim's
    # private one, and each reaches their own.
    colleague = clients["same app, other user"]
    assert (await colleague.post("/api/v1/agents", json={"agent_id": "secret", "name": "Mine"})).status_code == 201
    assert (await colleague.get("/api/v1/agents/secret")).json()["name"] == "Mine"
    assert (await victim.get("/api/v1/agents/secret")).json()["name"] == "Secret"
    assert own  # the attackers' own sessions exist; the victim's state is untouched:
    inbox = (await victim.get(f"/api/v1/trees/{ids['root']}/requests")).json()
    assert [r["id"] for r in inbox] == [ids["request"]]
    answered = await victim.post(f"/api/v1/requests/{ids['request']}/answer", json={"answer": "yes"})
    assert answered.status_code == 200
