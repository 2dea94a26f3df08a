"""Usage, budgets, archive refusals and interventions over real HTTP: a root created with a budget,
the summary's usage equal to the runs table, PATCH /trees/{id}/budget (validation, scoping), continue
refused (409) while a budget is used up and after an archive, archive refused with pending inputs,
archived roots hidden by default, an agent's default budget, and a member's interventions listed for
it and for its parent, and streamed; ``canopy run``'s live view shows the tree's usage."""

from __future__ import annotations

import httpx

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.records import Scope
from tests.api.conftest import ClientFactory
from tests.api.helpers import collect_events, poll, rows, terminal
from tests.api.test_api_cli import canopy

NO_LIMITS = {"max_tokens": None, "max_cost_usd": None, "max_seconds": None, "max_model_calls": None}


async def tree_of(http: httpx.AsyncClient, tree_id: str) -> dict:
    response = await http.get(f"/api/v1/trees/{tree_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def settled(http: httpx.AsyncClient, tree_id: str) -> dict | None:
    summary = await tree_of(http, tree_id)
    ended = all(m["turn_status"] in (None, "completed", "failed", "cancelled") for m in summary["members"])
    return summary if ended and summary["slots_in_use"] == 0 else None


async def test_a_root_with_a_budget_is_stopped_by_it_and_continue_waits_for_a_raise(
        runtime: Runtime, http: httpx.AsyncClient) -> None:
    text = script(*(call(("list_agents", {})) for _ in range(4)), say("never reached"))
    created = await http.post("/api/v1/sessions", json={"input": text, "budget": {"max_model_calls": 2}})
    assert created.status_code == 201, created.text
    tree_id = created.json()["session"]["tree_id"]
    await poll(lambda: terminal(http, created.json()["input"]["input_id"]))
    summary = await poll(lambda: settled(http, tree_id))
    assert summary["budget"] == {**NO_LIMITS, "max_model_calls": 2}
    assert (summary["stopped"], summary["stop_reason"]) == (True, "budget_exceeded")
    assert summary["stop_detail"] == {"budget_tree_id": tree_id, "limit": "model_calls", "max": 2.0, "used": 2.0}
    assert summary["budget_reached"]["limit"] == "model_calls"
    runs = (await rows(runtime.db, "SELECT sum(prompt_tokens) AS p, sum(completion_tokens) AS c, "
                                   "sum(model_calls) AS n FROM runs WHERE tree_id = %s", tree_id))[0]
    usage = summary["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["model_calls"]) == (runs["p"], runs["c"], 2)
    assert usage["tokens"] == runs["p"] + runs["c"] and usage["first_run_at"] is not None
    assert summary["members"][0]["usage"] == {k: usage[k] for k in summary["members"][0]["usage"]}
    assert summary["spawned_usage"]["trees"] == 0 and summary["lineage_id"] == tree_id

    refused = await http.post(f"/api/v1/trees/{tree_id}/continue")
    assert refused.status_code == 409
    assert "budget is used up (model calls 2 of 2)" in refused.json()["detail"]
    assert f"PATCH /trees/{tree_id}/budget" in refused.json()["detail"]
    assert (await tree_of(http, tree_id))["stop_reason"] == "budget_exceeded"

    for bad in ({"max_model_calls": 0}, {"max_tokens": -1}, {"max_wishes": 1}, {"max_cost_usd": "lots"},
                {"max_tokens": 2**70}):
        response = await http.patch(f"/api/v1/trees/{tree_id}/budget", json=bad)
        assert response.status_code == 422, (bad, response.text)
    assert (await tree_of(http, tree_id))["budget"] == {**NO_LIMITS, "max_model_calls": 2}

    raised = await http.patch(f"/api/v1/trees/{tree_id}/budget", json={"max_model_calls": 10, "max_tokens": 10**9})
    assert raised.status_code == 200, raised.text
    assert raised.json()["budget"] == {**NO_LIMITS, "max_model_calls": 10, "max_tokens": 10**9}
    assert raised.json()["budget_reached"] is None and raised.json()["stopped"] is True
    removed = await http.patch(f"/api/v1/trees/{tree_id}/budget", json={"max_tokens": None})
    assert removed.json()["budget"] == {**NO_LIMITS, "max_model_calls": 10}
    assert (await http.post(f"/api/v1/trees/{tree_id}/continue")).status_code == 202
    after = await tree_of(http, tree_id)
    assert (after["stopped"], after["stop_reason"], after["stop_detail"]) == (False, None, None)
    changed = await rows(runtime.db, "SELECT payload FROM events WHERE tree_id = %s AND kind = 'tree_budget_changed' "
                                     "ORDER BY cursor", tree_id)
    assert [e["payload"]["budget"]["max_model_calls"] for e in changed] == [10, 10]


async def test_budget_routes_refuse_bad_bodies_and_other_scopes(client_for: ClientFactory, scope: Scope,
                                                                runtime: Runtime) -> None:
    http = await client_for(scope)
    other = await client_for(Scope(scope.user_id + "-x", scope.app_id))
    before = (await rows(runtime.db, "SELECT count(*) AS n FROM trees WHERE user_id = %s", scope.user_id))[0]["n"]
    for bad in ({"max_tokens": 0}, {"max_seconds": -1.0}, {"max_model_calls": 1.5}, {"tokens": 5}):
        response = await http.post("/api/v1/sessions", json={"input": "x", "budget": bad})
        assert response.status_code == 422, (bad, response.text)
    after = (await rows(runtime.db, "SELECT count(*) AS n FROM trees WHERE user_id = %s", scope.user_id))[0]["n"]
    assert after == before
    created = (await http.post("/api/v1/sessions", json={"budget": {"max_cost_usd": 0.5}})).json()
    tree_id = created["session"]["tree_id"]
    assert (await tree_of(http, tree_id))["budget"] == {**NO_LIMITS, "max_cost_usd": 0.5}
    assert (await other.patch(f"/api/v1/trees/{tree_id}/budget", json={"max_cost_usd": 99})).status_code == 404
    assert (await other.get(f"/api/v1/sessions/{tree_id}/interventions")).status_code == 404
    assert (await tree_of(http, tree_id))["budget"]["max_cost_usd"] == 0.5


async def test_budget_limits_refuse_booleans_and_strings(runtime: Runtime, http: httpx.AsyncClient,
                                                        scope: Scope) -> None:
    async def stored() -> list[dict[str, object]]:
        return await rows(runtime.db, "SELECT tree_id, budget_tokens, budget_cost_usd, budget_seconds, "
                                      "budget_model_calls FROM trees WHERE user_id = %s ORDER BY tree_id",
                          scope.user_id)

    created = await http.post("/api/v1/sessions", json={"budget": {"max_model_calls": 3, "max_cost_usd": 2}})
    assert created.status_code == 201, created.text
    tree_id = created.json()["session"]["tree_id"]
    before = await stored()
    # JSON true would be a 1-token budget and "5" a number the client never sent as one.
    bad_limits = ({"max_tokens": True}, {"max_tokens": "5"}, {"max_tokens": 5.0}, {"max_cost_usd": True},
                  {"max_cost_usd": "0.5"}, {"max_seconds": False}, {"max_seconds": "60"}, {"max_model_calls": True})
    for bad in bad_limits:
        response = await http.patch(f"/api/v1/trees/{tree_id}/budget", json=bad)
        assert response.status_code == 422, (bad, response.text)
        assert (await http.post("/api/v1/sessions", json={"budget": bad})).status_code == 422, bad
        made = await http.post("/api/v1/agents", json={"agent_id": "lax", "name": "Lax", "budget": bad})
        assert made.status_code == 422, (bad, made.text)
    assert await stored() == before
    assert await rows(runtime.db, "SELECT agent_id FROM agents WHERE app_id = %s", scope.app_id) == []
    # An integer is still a number of USD or seconds.
    taken = await http.patch(f"/api/v1/trees/{tree_id}/budget", json={"max_seconds": 60, "max_cost_usd": 0.25})
    assert taken.status_code == 200, taken.text
    assert (await tree_of(http, tree_id))["budget"] == {**NO_LIMITS, "max_model_calls": 3, "max_cost_usd": 0.25,
                                                        "max_seconds": 60.0}


async def test_an_agents_default_budget_applies_to_the_roots_it_starts(http: httpx.AsyncClient) -> None:
    made = await http.post("/api/v1/agents", json={"agent_id": "thrifty", "name": "Thrifty",
                                                   "budget": {"max_tokens": 5000}})
    assert made.status_code == 201, made.text
    assert made.json()["budget"] == {"max_tokens": 5000}
    root = (await http.post("/api/v1/sessions", json={"agent_id": "thrifty"})).json()
    assert (await tree_of(http, root["session"]["tree_id"]))["budget"]["max_tokens"] == 5000
    chosen = (await http.post("/api/v1/sessions", json={"agent_id": "thrifty", "budget": {"max_model_calls": 3}}))
    assert (await tree_of(http, chosen.json()["session"]["tree_id"]))["budget"] == {**NO_LIMITS,
                                                                                   "max_model_calls": 3}
    cleared = await http.patch("/api/v1/agents/thrifty", json={"budget": {}})
    assert cleared.status_code == 200 and cleared.json()["budget"] is None
    assert (await http.patch("/api/v1/agents/thrifty", json={"budget": {"max_tokens": 0}})).status_code == 422


async def test_archive_refusals_leave_everything_as_it_was(runtime: Runtime, http: httpx.AsyncClient) -> None:
    text = script(call(create("a", script(say("a done", delay_ms=30_000)))), say("root done"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    root_id = created["session"]["session_id"]
    await poll(lambda: terminal(http, created["input"]["input_id"]))
    member = next(m for m in (await tree_of(http, root_id))["members"] if m["path"] == "/root/a")
    queued = await http.post(f"/api/v1/sessions/{member['session_id']}/inputs", json={"text": "later"})
    assert queued.json()["status"] == "queued"

    busy = await http.post(f"/api/v1/sessions/{root_id}/archive")
    assert busy.status_code == 409 and "/root/a is running" in busy.json()["detail"]
    assert (await http.post(f"/api/v1/trees/{root_id}/stop")).status_code == 202
    await poll(lambda: settled(http, root_id))
    pending = await http.post(f"/api/v1/sessions/{root_id}/archive")
    assert pending.status_code == 409 and "/root/a has 1 pending input" in pending.json()["detail"]
    archived = await rows(runtime.db, "SELECT archived FROM sessions WHERE tree_id = %s", root_id)
    assert {r["archived"] for r in archived} == {False}
    assert (await http.get(f"/api/v1/sessions/{member['session_id']}/inputs",
                           params={"status": "pending"})).json()[0]["text"] == "later"

    # Once the pending input is cancelled the tree can be archived; then it cannot be continued,
    # and it is hidden from the default session list.
    pending_id = (await http.get(f"/api/v1/sessions/{member['session_id']}/inputs",
                                 params={"status": "pending"})).json()[0]["input_id"]
    assert (await http.post(f"/api/v1/inputs/{pending_id}/cancel")).status_code == 200
    assert (await http.post(f"/api/v1/sessions/{root_id}/archive")).status_code == 200
    refused = await http.post(f"/api/v1/trees/{root_id}/continue")
    assert refused.status_code == 409 and "archived" in refused.json()["detail"]
    summary = await tree_of(http, root_id)
    assert summary["archived"] and summary["stopped"]
    listed = [s["session_id"] for s in (await http.get("/api/v1/sessions")).json()]
    with_archived = [s["session_id"] for s in (await http.get("/api/v1/sessions",
                                                             params={"include_archived": "true"})).json()]
    assert root_id not in listed and root_id in with_archived


async def test_interventions_on_a_member_are_listed_and_streamed(http: httpx.AsyncClient) -> None:
    text = script(call(create("a", script(say("a first", delay_ms=8000), say("a second")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("root done"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    root_id = created["session"]["session_id"]

    async def running_member() -> str | None:
        members = (await tree_of(http, root_id))["members"]
        member = next((m for m in members if m["path"] == "/root/a"), None)
        return member["session_id"] if member and member["activity"] == "running" else None

    member_id = await poll(running_member)
    cursor = (await tree_of(http, root_id))["event_cursor"]
    steered = await http.post(f"/api/v1/sessions/{member_id}/steer", json={"text": "keep it short"})
    assert steered.status_code == 202, steered.text
    given = await http.post(f"/api/v1/sessions/{member_id}/inputs", json={"text": "and then this"})
    assert given.status_code == 202
    streamed = await collect_events(http, f"/api/v1/trees/{root_id}/events", params={"after": cursor},
                                    until=lambda e: e["kind"] == "user_intervention"
                                    and e["payload"]["action"] == "input")
    shown = [e for e in streamed if e["kind"] == "user_intervention"]
    assert [(e["session_id"], e["payload"]["action"], e["payload"]["text"]) for e in shown] == \
        [(root_id, "steer", "keep it short"), (root_id, "input", "and then this")]

    for session_id in (member_id, root_id):
        listed = (await http.get(f"/api/v1/sessions/{session_id}/interventions")).json()
        assert [(i["action"], i["member_session_id"], i["parent_session_id"], i["path"], i["payload"]["text"])
                for i in listed] == [("steer", member_id, root_id, "/root/a", "keep it short"),
                                     ("input", member_id, root_id, "/root/a", "and then this")]
    later = await http.get(f"/api/v1/sessions/{member_id}/interventions", params={"after": listed[0]["cursor"]})
    assert [i["action"] for i in later.json()] == ["input"]


async def test_canopy_run_shows_the_trees_usage(runtime: Runtime, scope: Scope) -> None:
    who = ["--user", scope.user_id, "--app", scope.app_id]
    task = script(call(create("helper", script(say("helped")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("result: ${1.results.0.output}"))
    code, out = await canopy(runtime, "run", task, *who, join_ray=True)
    assert code == 0 and out.rstrip().endswith("result: helped"), out
    root = await rows(runtime.db, "SELECT session_id FROM sessions WHERE user_id = %s AND parent_id IS NULL",
                      scope.user_id)
    summary = await runtime.tree_summary(scope, root[0]["session_id"])
    spent = summary["usage"]
    assert spent["model_calls"] == 4
    assert (f"tokens {spent['tokens']:,} ({spent['prompt_tokens']:,} in / {spent['completion_tokens']:,} out)"
            f"  ·  model calls 4" in out), out
    helper = next(m for m in summary["members"] if m["path"] == "/root/helper")
    assert f"{helper['usage']['tokens']:,}" in out
