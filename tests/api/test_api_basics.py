"""Basics over real HTTP: auth, validation, limits, errors, directory routes, idempotency."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.runtime import Runtime
from actors.scripted import say, script
from api import reference
from api.app import create_app
from api.routes import health
from persistence import quotas
from persistence.db import lock_name
from persistence.records import Scope
from persistence.settings import Settings
from tests.api.conftest import ApiServer, ClientFactory, uvicorn_server
from tests.api.helpers import ADMIN_TOKEN, METRICS_TOKEN, client, poll, rows, terminal


async def test_health_metrics_and_openapi(api: ApiServer, second_api: ApiServer, http: httpx.AsyncClient) -> None:
    created = (await http.post("/api/v1/sessions", json={"input": script(say("counted"))})).json()
    await poll(lambda: terminal(http, created["input"]["input_id"]))
    async with client(api.url, None) as anon:
        health = await anon.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json() == {"status": "ok", "database": "ok", "ray": "ok"}
        assert (await anon.get("/api/v1/healthz")).json() == health.json()
        for path in ("/metrics", "/api/v1/metrics"):  # a token is needed, an API key is not one
            refused = await anon.get(path)
            assert refused.status_code == 401 and "CANOPY_METRICS_TOKEN" in refused.json()["detail"]
            assert (await http.get(path)).status_code == 401
            assert (await anon.get(path, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})).status_code == 401
    async with client(second_api.url, METRICS_TOKEN) as scraper:  # the replica configured with a metrics token
        assert (await scraper.get("/metrics")).status_code == 200
    async with client(api.url, ADMIN_TOKEN) as admin:

        async def scraped() -> dict[str, Any] | None:  # counts reach the table within a second of the commit
            metrics = await admin.get("/metrics")
            assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
            families = {family.name: family for family in text_string_to_metric_families(metrics.text)}
            completed = [s.value for s in families["canopy_turns_ended"].samples if s.labels["status"] == "completed"]
            timed = [s.value for s in families["canopy_model_latency_seconds"].samples if s.name.endswith("_count")]
            return families if completed and completed[0] >= 1 and timed and max(timed) >= 1 else None

        families = await poll(scraped)
        for name in ("canopy_slots_in_use", "canopy_queue_depth", "canopy_turns", "canopy_recoveries",
                     "canopy_model_calls", "canopy_model_tokens", "canopy_model_latency_seconds"):
            assert name in families, sorted(families)
        latency = {s.name for s in families["canopy_model_latency_seconds"].samples}
        assert {"canopy_model_latency_seconds_bucket", "canopy_model_latency_seconds_sum"} <= latency
    async with client(api.url, None) as anon:
        document = (await anon.get("/openapi.json")).json()
        paths = document["paths"]
        for path in ("/api/v1/sessions", "/api/v1/trees/{tree_id}/events", "/api/v1/requests/{request_id}/answer",
                     "/api/v1/admin/keys", "/api/v1/admin/keys/{key_id}/revoke", "/healthz", "/metrics"):
            assert path in paths


async def test_auth_is_required(api: ApiServer, http: httpx.AsyncClient) -> None:
    async with client(api.url, None) as anon:
        missing = await anon.get("/api/v1/sessions")
        assert missing.status_code == 401 and isinstance(missing.json()["detail"], str)
    async with client(api.url, "cnp_not-a-key") as wrong:
        assert (await wrong.get("/api/v1/sessions")).status_code == 401
        assert (await wrong.get("/api/v1/me")).status_code == 401
    assert (await http.get("/api/v1/sessions")).status_code == 200


async def test_admin_creates_keys(api: ApiServer) -> None:
    async with client(api.url, ADMIN_TOKEN) as admin:
        created = await admin.post("/api/v1/admin/keys", json={"user_id": "alice", "app_id": "notes"})
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["user_id"], body["app_id"]) == ("alice", "notes")
    async with client(api.url, body["api_key"]) as alice:
        assert (await alice.get("/api/v1/projects")).status_code == 200
        assert (await alice.get("/api/v1/me")).json() == {"user_id": "alice", "app_id": "notes"}  # whose key
        # An API key is not the admin token.
        refused = await alice.post("/api/v1/admin/keys", json={"user_id": "x", "app_id": "y"})
        assert refused.status_code == 401


async def test_validation_and_limits(http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    too_long = await http.post("/api/v1/sessions", json={"input": "x" * 100_001})
    assert too_long.status_code == 422 and "100000" in too_long.json()["detail"]
    nul = await http.post("/api/v1/sessions", json={"title": "a\u0000b"})
    assert nul.status_code == 422
    long_title = await http.post("/api/v1/sessions", json={"title": "t" * 501, "input": "hello"})
    assert long_title.status_code == 422 and "500" in long_title.text, long_title.text
    surrogate = await http.post("/api/v1/sessions", content=b'{"input": "a\\ud800b"}',
                                headers={"Content-Type": "application/json"})
    assert surrogate.status_code == 422 and "unicode" in surrogate.text
    malformed = await http.post("/api/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 422
    # Nested past the JSON parser's depth (well under the size limit): FastAPI's 400, not a 500.
    deep = await http.post("/api/v1/sessions", content=b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                           headers={"Content-Type": "application/json"})
    assert deep.status_code == 400 and deep.json() == {"detail": "There was an error parsing the body"}
    unknown = await http.post("/api/v1/sessions", json={"inputt": "typo"})
    assert unknown.status_code == 422
    # A problem for each of 50,000 extra keys (under 1 MiB) was a 7 MB answer, and ~0.2 s of CPU to
    # make (one long key named twice, twice its length): past a few, they are one problem that
    # counts them and names the first, each cut short. A few are a problem each.
    many = await http.post("/api/v1/sessions", json={"title": "many", **{f"k{i}": 0 for i in range(50_000)}})
    assert many.status_code == 422 and len(many.content) < 2_000, len(many.content)
    assert len(many.json()["errors"]) == 1 and "50000 unknown fields: k0, k1, k2, k3, k4, …" in many.json()["detail"], \
        many.json()
    few = await http.post("/api/v1/sessions", json={f"k{i}": 0 for i in range(3)})
    assert few.status_code == 422 and [e["loc"] for e in few.json()["errors"]] == [["body", f"k{i}"] for i in range(3)]
    long_key = await http.post("/api/v1/sessions", json={"k" * 500_000: 0})
    assert long_key.status_code == 422 and len(long_key.content) < 2_000, len(long_key.content)
    huge = await http.post("/api/v1/sessions", content=b"x" * (1024 * 1024 + 1),
                           headers={"Content-Type": "application/json"})
    assert huge.status_code == 413 and "detail" in huge.json()
    not_found = await http.get("/api/v1/sessions/00000000-0000-0000-0000-000000000000")
    assert not_found.status_code == 404 and isinstance(not_found.json()["detail"], str)
    assert await rows(runtime.db, "SELECT count(*) AS n FROM sessions WHERE user_id = %s AND app_id = %s",
                      scope.user_id, scope.app_id) == [{"n": 0}]  # nothing refused was made
    kept = (await http.post("/api/v1/sessions", json={"title": "kept"})).json()["session"]["session_id"]
    assert (await http.patch(f"/api/v1/sessions/{kept}", json={"title": "t" * 501})).status_code == 422
    assert await rows(runtime.db, "SELECT title FROM sessions WHERE session_id = %s", kept) == [{"title": "kept"}]
    assert (await http.patch(f"/api/v1/sessions/{kept}", json={"title": "t" * 500})).status_code == 200


def _integer_query_parameters(app: Any) -> list[tuple[str, str, str]]:
    """(method, path, name) of every query parameter the API documents as an integer."""
    found = []
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                types = {s.get("type") for s in [parameter["schema"], *parameter["schema"].get("anyOf", [])]}
                if parameter["in"] == "query" and "integer" in types:
                    found.append((method, path, parameter["name"]))
    return found


async def test_an_integer_in_a_query_is_written_in_plain_digits(api: ApiServer, http: httpx.AsyncClient,
                                                               runtime: Runtime, scope: Scope) -> None:
    """pydantic's lax parse took ``+5``, ``1_0``, `` 5 ``, ``05`` and ``5.0`` as numbers: a cursor or
    a page size spelled several ways is a cache key and a log line that disagree. Digits only, no
    leading zero (a minus for a negative, refused by its bound with its own message)."""
    parameters = _integer_query_parameters(api.app)
    assert {("get", "/api/v1/sessions/{session_id}/events", "after"), ("get", "/api/v1/sessions", "limit"),
            ("get", "/api/v1/admin/keys", "offset")} <= set(parameters), parameters
    async with client(api.url, ADMIN_TOKEN) as admin:
        for method, path, name in parameters:
            url = re.sub(r"\{[a-z_]+\}", str(uuid.uuid4()), path)
            caller = admin if path.startswith("/api/v1/admin/") else http
            for spelling in ("+5", "1_0", " 5", "5 ", "５", "05", "-0", "5.0", "1" * 20):
                refused = await caller.request(method, url, params={name: spelling})
                problems = [e["loc"][:2] for e in refused.json()["errors"]] if refused.status_code == 422 else []
                assert ["query", name] in problems, (method, path, name, spelling, refused.text)
            taken = await caller.request(method, url, params={name: "5"})
            assert taken.status_code != 422 or ["query", name] not in [e["loc"][:2] for e in taken.json()["errors"]], \
                (method, path, name, taken.text)
            negative = await caller.request(method, url, params={name: "-1"})
            assert negative.status_code == 422 and "greater than or equal" in negative.text, (path, name, negative.text)
    last = await http.get(f"/api/v1/sessions/{uuid.uuid4()}/events", params={"after": "last"})
    assert last.status_code == 422 and "or 'latest'" in last.json()["detail"], last.text
    assert await rows(runtime.db, "SELECT count(*) AS n FROM sessions WHERE user_id = %s AND app_id = %s",
                      scope.user_id, scope.app_id) == [{"n": 0}]


async def test_sessions_list_newest_first_and_archive(http: httpx.AsyncClient, scope: Scope) -> None:
    first = (await http.post("/api/v1/sessions", json={"title": "first"})).json()["session"]
    second = await http.post("/api/v1/sessions", json={"title": "second", "input": script(say("hi"))})
    assert second.status_code == 201, second.text
    body = second.json()
    assert body["input"]["status"] == "started"
    listed = (await http.get("/api/v1/sessions")).json()
    assert [s["title"] for s in listed] == ["second", "first"]
    assert (await http.get("/api/v1/sessions", params={"offset": 1, "limit": 1})).json()[0]["title"] == "first"
    archived = await http.post(f"/api/v1/sessions/{first['session_id']}/archive")
    assert archived.status_code == 200 and archived.json()["status"] == "archived"
    assert [s["title"] for s in (await http.get("/api/v1/sessions")).json()] == ["second"]
    project = first["project_id"]
    by_project = await http.get("/api/v1/sessions", params={"scope": "project", "project_id": project})
    assert [s["title"] for s in by_project.json()] == ["second"]


async def test_pages_of_roots_are_not_shifted_by_roots_made_or_archived_between_them(
        http: httpx.AsyncClient) -> None:
    """The list paged by offset, newest first: a root made between two page reads showed the last
    of the first page again, and one archived hid a root from both. A page links the next one after
    its last root, which neither shifts."""
    made = [(await http.post("/api/v1/sessions", json={"title": title})).json()["session"]["session_id"]
            for title in ("a", "b", "c")]
    first = await http.get("/api/v1/sessions", params={"limit": 2})
    assert [s["title"] for s in first.json()] == ["c", "b"]
    await http.post("/api/v1/sessions", json={"title": "d"})  # made between the two reads
    assert (await http.post(f"/api/v1/sessions/{made[2]}/archive")).status_code == 200  # and "c" archived
    following = await http.get(str(first.url.join(first.links["next"]["url"])))
    assert [s["title"] for s in following.json()] == ["a"] and "next" not in following.links
    assert (await http.get("/api/v1/sessions", params={"before": str(uuid.uuid4())})).status_code == 404


async def test_idempotency_key(http: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "create-once"}
    one = await http.post("/api/v1/sessions", json={"title": "once"}, headers=headers)
    two = await http.post("/api/v1/sessions", json={"title": "once"}, headers=headers)
    assert one.status_code == two.status_code == 201
    assert one.json() == two.json()
    assert two.headers.get("Idempotent-Replayed") == "true"
    other = await http.post("/api/v1/sessions", json={"title": "different"}, headers=headers)
    assert other.status_code == 422
    listed = (await http.get("/api/v1/sessions")).json()
    assert [s["title"] for s in listed] == ["once"]
    # A retry may spell the session's id otherwise (a client library, a proxy that changes case).
    session_id = listed[0]["session_id"]
    spellings = [session_id, session_id.upper(), session_id.replace("-", ""), f"urn:uuid:{session_id}"]
    submits = [await http.post(f"/api/v1/sessions/{spelled}/inputs", json={"text": "once"},
                               headers={"Idempotency-Key": "submit-once-spelled"}) for spelled in spellings]
    assert [a.status_code for a in submits] == [202] * 4, [a.text for a in submits]
    assert len({a.json()["input_id"] for a in submits}) == 1
    assert [a.headers.get("Idempotent-Replayed") for a in submits] == [None, "true", "true", "true"]


def test_every_post_write_takes_an_idempotency_key() -> None:
    """The SPEC's HTTP writes take an optional Idempotency-Key; PATCH and DELETE are idempotent by
    themselves, and the admin routes take none (api/writes.py). The compaction request had none."""
    paths = create_app().openapi()["paths"]
    keyless = [f"POST {path}" for path, operations in paths.items() if "post" in operations
               and not path.startswith("/api/v1/admin/")
               and "Idempotency-Key" not in {p["name"] for p in operations["post"].get("parameters", [])
                                             if p["in"] == "header"}]
    assert keyless == []


async def test_a_compaction_is_asked_once_per_key_and_never_of_an_archived_session(
        http: httpx.AsyncClient, runtime: Runtime) -> None:
    """A compaction request took no Idempotency-Key: a retry after its answer was lost asked for a
    second compaction (another billed summary) once the first was served."""
    session_id = (await http.post("/api/v1/sessions", json={"title": "long"})).json()["session"]["session_id"]
    url, key = f"/api/v1/sessions/{session_id}/compact", {"Idempotency-Key": "compact-once"}

    async def asked() -> bool:
        found = await rows(runtime.db, "SELECT compact_requested FROM sessions WHERE session_id = %s", session_id)
        return bool(found[0]["compact_requested"])

    first = await http.post(url, headers=key)
    assert first.status_code == 202 and await asked()
    async with runtime.db.tx() as conn:  # served, as the session's next model call serves it
        await conn.execute("UPDATE sessions SET compact_requested = false WHERE session_id = %s", (session_id,))
    retried = await http.post(url, headers=key)
    assert retried.status_code == 202 and retried.headers.get("Idempotent-Replayed") == "true"
    assert retried.json() == first.json() and not await asked()
    assert (await http.post(f"/api/v1/sessions/{session_id}/archive")).status_code == 200
    refused = await http.post(url)
    assert refused.status_code == 409 and "archived" in refused.json()["detail"] and not await asked()


async def test_concurrent_requests_with_one_idempotency_key_write_once(http: httpx.AsyncClient) -> None:
    root = (await http.post("/api/v1/sessions", json={"title": "target"})).json()["session"]
    headers = {"Idempotency-Key": "submit-once"}
    body = {"text": script(say("once"))}
    answers = await asyncio.gather(*(http.post(f"/api/v1/sessions/{root['session_id']}/inputs", json=body,
                                               headers=headers) for _ in range(6)))
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["input_id"] for a in answers}) == 1
    session = (await http.get(f"/api/v1/sessions/{root['session_id']}/messages")).json()
    assert len([m for m in session if m["role"] == "user"]) == 1


async def test_agents_and_projects(http: httpx.AsyncClient, runtime: Runtime) -> None:
    created = await http.post("/api/v1/agents", json={"agent_id": "writer", "name": "Writer",
                                                       "instructions": "Write well."})
    assert created.status_code == 201, created.text
    assert created.json()["id"] == "writer" and created.json()["model"] == "canopy/scripted"
    assert (await http.post("/api/v1/agents", json={"agent_id": "writer", "name": "W"})).status_code == 409
    patched = await http.patch("/api/v1/agents/writer", json={"approval_mode": "ask"})
    assert patched.status_code == 200 and patched.json()["approval_mode"] == "ask"
    assert (await http.patch("/api/v1/agents/writer", json={"name": None})).status_code == 422
    assert [a["id"] for a in (await http.get("/api/v1/agents")).json()] == ["writer"]
    project = await http.post("/api/v1/projects", json={"name": "garden"})
    assert project.status_code == 201
    root = await http.post("/api/v1/sessions", json={"project_id": project.json()["project_id"],
                                                      "agent_id": "writer"})
    assert root.status_code == 201, root.text
    found = await rows(runtime.db, "SELECT agent_config FROM sessions WHERE session_id = %s",
                       root.json()["session"]["session_id"])
    assert found[0]["agent_config"]["approval_mode"] == "ask"

    # The owner deletes it: gone from the directory, its id free again; the session keeps its copy.
    assert (await http.delete("/api/v1/agents/writer")).status_code == 204
    assert (await http.get("/api/v1/agents/writer")).status_code == 404
    assert (await http.delete("/api/v1/agents/writer")).status_code == 404
    assert (await http.get("/api/v1/agents")).json() == []
    kept = await rows(runtime.db, "SELECT agent_id, agent_config FROM sessions WHERE session_id = %s",
                      root.json()["session"]["session_id"])
    assert kept == [{"agent_id": "writer", "agent_config": found[0]["agent_config"]}]
    again = await http.post("/api/v1/agents", json={"agent_id": "writer", "name": "Writer again"})
    assert again.status_code == 201 and again.json()["name"] == "Writer again"


async def test_a_conversation_past_the_scopes_quota_is_a_429_until_one_is_archived(
        http: httpx.AsyncClient, runtime: Runtime, scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    first = (await http.post("/api/v1/sessions", json={"title": "first"})).json()["session"]["session_id"]
    monkeypatch.setattr(runtime.settings, "max_roots_per_scope", 1)

    refused = await http.post("/api/v1/sessions", json={"title": "second", "input": "hello"})
    before = await rows(runtime.db, "SELECT count(*) AS n FROM inputs WHERE user_id = %s AND app_id = %s",
                        scope.user_id, scope.app_id)
    assert (await http.post(f"/api/v1/sessions/{first}/archive")).status_code == 200
    made = await http.post("/api/v1/sessions", json={"title": "second"})

    assert refused.status_code == 429 and "CANOPY_MAX_ROOTS_PER_SCOPE" in refused.json()["detail"], refused.text
    assert before == [{"n": 0}]
    assert made.status_code == 201, made.text
    titles = await rows(runtime.db, "SELECT title FROM sessions WHERE user_id = %s AND app_id = %s ORDER BY created_at",
                        scope.user_id, scope.app_id)
    assert [row["title"] for row in titles] == ["first", "second"]


@pytest.mark.parametrize(("kind", "body", "quota", "made"), [
    # The quota's last place: the second send found the quota full (429).
    ("projects", {"name": "last"}, "max_projects_per_scope",
     "SELECT project_id AS id FROM projects WHERE user_id = %s AND app_id = %s AND name = 'last'"),
    # The id the first send made: the second found it taken (409).
    ("agents", {"agent_id": "made-once", "name": "Once"}, None,
     "SELECT agent_id AS id FROM agents WHERE owner_user_id = %s AND app_id = %s"),
])
async def test_one_request_sent_twice_is_made_once_and_replayed_though_the_first_leaves_it_no_room(
        http: httpx.AsyncClient, runtime: Runtime, scope: Scope, monkeypatch: pytest.MonkeyPatch, kind: quotas.Kind,
        body: dict[str, str], quota: str | None, made: str) -> None:
    """A client's retry with the same Idempotency-Key while the first send is under way: the second
    waited for the first's quota lock, then was refused for what the first had just made."""
    if quota is not None:  # one place left
        monkeypatch.setattr(runtime.settings, quota, len((await http.get(f"/api/v1/{kind}")).json()) + 1)
    headers = {"Idempotency-Key": f"twice-{uuid.uuid4().hex}"}
    async with runtime.db.tx() as conn:
        await quotas.hold(conn, scope, kind)
        sends = [asyncio.ensure_future(http.post(f"/api/v1/{kind}", json=body, headers=headers)) for _ in range(2)]
        await poll(lambda: _waiting_for_the_lock(runtime, lock_name(*quotas.lock_parts(scope, kind)), 2))
    answers = await asyncio.gather(*sends)

    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    assert answers[0].json() == answers[1].json()
    found = await rows(runtime.db, made, scope.user_id, scope.app_id)
    assert [str(row["id"]) for row in found] == [str(answers[0].json().get("project_id") or answers[0].json()["id"])]


async def _waiting_for_the_lock(runtime: Runtime, key: str, waiters: int) -> bool:
    found = await rows(runtime.db, """
        SELECT count(*) AS n FROM pg_locks, hashtextextended(%s, 0) AS h
        WHERE locktype = 'advisory' AND NOT granted
          AND classid::bigint = (h >> 32) & 4294967295 AND objid::bigint = h & 4294967295""", key)
    return int(found[0]["n"]) >= waiters


async def test_a_project_without_conversations_is_deleted_and_frees_its_quota_place(
        http: httpx.AsyncClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = (await http.post("/api/v1/projects", json={"name": "empty"})).json()["project_id"]
    used = (await http.post("/api/v1/projects", json={"name": "used"})).json()["project_id"]
    assert (await http.post("/api/v1/sessions", json={"project_id": used})).status_code == 201

    kept = await http.delete(f"/api/v1/projects/{used}")
    assert kept.status_code == 409 and "holds 1 conversation" in kept.json()["detail"], kept.text
    # Full: only the delete makes room.
    monkeypatch.setattr(runtime.settings, "max_projects_per_scope", len((await http.get("/api/v1/projects")).json()))
    assert (await http.delete(f"/api/v1/projects/{empty}")).status_code == 204
    again = await http.post("/api/v1/projects", json={"name": "in its place"})

    assert again.status_code == 201, again.text
    assert (await http.delete(f"/api/v1/projects/{empty}")).status_code == 404
    listed = {p["project_id"] for p in (await http.get("/api/v1/projects")).json()}
    assert used in listed and empty not in listed and again.json()["project_id"] in listed
    assert await rows(runtime.db, "SELECT project_id FROM projects WHERE project_id = %s", empty) == []


async def test_a_patch_nulling_a_field_named_by_a_lone_surrogate_is_refused(http: httpx.AsyncClient,
                                                                           runtime: Runtime, scope: Scope) -> None:
    async def stored() -> list[dict[str, object]]:
        return await rows(runtime.db, "SELECT * FROM agents WHERE app_id = %s", scope.app_id)

    assert (await http.post("/api/v1/agents", json={"agent_id": "plain", "name": "Plain"})).status_code == 201
    before = await stored()
    # Raw JSON text: a JSON escape is the only way a client can send a key UTF-8 cannot encode.
    for body in ('{"\\udfff": null}', '{"name": null, "\\ud800": null}'):
        refused = await http.patch("/api/v1/agents/plain", content=body, headers={"Content-Type": "application/json"})
        assert refused.status_code == 422, (body, refused.text)
        assert "omit a field" in refused.json()["detail"] and "\\ud" in refused.json()["detail"]
    assert await stored() == before


async def test_agent_flags_and_numbers_refuse_other_json_types(http: httpx.AsyncClient, runtime: Runtime,
                                                              scope: Scope) -> None:
    async def stored() -> list[dict[str, object]]:
        return await rows(runtime.db, "SELECT * FROM agents WHERE app_id = %s", scope.app_id)

    bad_fields = ({"shared": 1}, {"shared": "true"}, {"compact_at_tokens": "2000"}, {"compact_at_tokens": 2000.0})
    for bad in bad_fields:
        made = await http.post("/api/v1/agents", json={"agent_id": "typed", "name": "Typed", **bad})
        assert made.status_code == 422, (bad, made.text)
    assert await stored() == []
    assert (await http.post("/api/v1/agents", json={"agent_id": "typed", "name": "Typed"})).status_code == 201
    before = await stored()
    for bad in bad_fields:
        patched = await http.patch("/api/v1/agents/typed", json=bad)
        assert patched.status_code == 422, (bad, patched.text)
    assert await stored() == before


async def test_an_agents_endpoint_and_key_name_are_checked_and_frozen(http: httpx.AsyncClient, runtime: Runtime,
                                                                      scope: Scope) -> None:
    async def stored() -> list[dict[str, object]]:
        return await rows(runtime.db, "SELECT agent_id, model, api_base, api_key_ref FROM agents WHERE app_id = %s",
                          scope.app_id)

    refused = await http.post("/api/v1/agents", json={"agent_id": "remote", "name": "Remote", "model": "openai/qwen",
                                                       "api_base": "http://127.0.0.1:9/v1",
                                                       "api_key_ref": "NO_SUCH_PROVIDER_KEY"})
    assert refused.status_code == 422 and "NO_SUCH_PROVIDER_KEY" in refused.json()["detail"], refused.text
    missing = await http.post("/api/v1/agents", json={"agent_id": "remote", "name": "Remote",
                                                      "model": "groq/llama-3.1-8b-instant"})
    assert missing.status_code == 422 and "GROQ_API_KEY" in missing.json()["detail"], missing.text
    a_key = await http.post("/api/v1/agents", json={"agent_id": "remote", "name": "Remote", "model": "openai/qwen",
                                                    "api_key_ref": "sk-not-a-name"})
    assert a_key.status_code == 422 and "api_key_ref" in a_key.json()["detail"], a_key.text
    assert await stored() == []

    created = await http.post("/api/v1/agents", json={"agent_id": "remote", "name": "Remote", "model": "openai/qwen",
                                                      "api_base": "http://127.0.0.1:9/v1"})
    assert created.status_code == 201, created.text
    assert (created.json()["api_base"], created.json()["api_key_ref"]) == ("http://127.0.0.1:9/v1", None)
    patched = await http.patch("/api/v1/agents/remote", json={"api_key_ref": "NO_SUCH_PROVIDER_KEY"})
    assert patched.status_code == 422 and "NO_SUCH_PROVIDER_KEY" in patched.json()["detail"], patched.text
    assert await stored() == [{"agent_id": "remote", "model": "openai/qwen", "api_base": "http://127.0.0.1:9/v1",
                               "api_key_ref": None}]
    root = await http.post("/api/v1/sessions", json={"agent_id": "remote"})
    found = await rows(runtime.db, "SELECT agent_config FROM sessions WHERE session_id = %s",
                       root.json()["session"]["session_id"])
    assert (found[0]["agent_config"]["api_base"], found[0]["agent_config"]["api_key_ref"]) == (
        "http://127.0.0.1:9/v1", None)
    cleared = await http.patch("/api/v1/agents/remote", json={"model": "canopy/scripted", "api_base": None})
    assert cleared.status_code == 200 and cleared.json()["api_base"] is None, cleared.text
    # A compaction threshold of its own goes back to the setting's the same way.
    own = await http.patch("/api/v1/agents/remote", json={"compact_at_tokens": 5000})
    assert own.status_code == 200 and own.json()["compact_at_tokens"] == 5000, own.text
    back = await http.patch("/api/v1/agents/remote", json={"compact_at_tokens": None})
    assert back.status_code == 200, back.text
    assert (await http.get("/api/v1/agents/remote")).json()["compact_at_tokens"] is None


async def test_a_colleagues_shared_agent_is_not_theirs_to_edit(client_for: ClientFactory, runtime: Runtime,
                                                                scope: Scope) -> None:
    """Only the owner edits an agent: another user of the app, who sees a shared one, gets 404 whatever
    the edit (an unusable model was a 422 with the gateway's sentence, asked of the gateway first)."""
    owner = await client_for(scope)
    colleague = await client_for(Scope("colleague-" + uuid.uuid4().hex[:6], scope.app_id))
    made = await owner.post("/api/v1/agents", json={"agent_id": "team", "name": "Team", "shared": True})
    assert made.status_code == 201, made.text
    assert (await colleague.get("/api/v1/agents/team")).status_code == 200
    for edit in ({"model": "nosuch/x"}, {"model": "canopy/scripted"}, {"name": "Mine now"}):
        refused = await colleague.patch("/api/v1/agents/team", json=edit)
        assert refused.status_code == 404 and "that you own" in refused.json()["detail"], (edit, refused.text)
    assert await rows(runtime.db, "SELECT name, model FROM agents WHERE agent_id = 'team' AND app_id = %s",
                      scope.app_id) == [{"name": "Team", "model": made.json()["model"]}]


async def test_the_agent_list_goes_on_after_the_last_agent_read(client_for: ClientFactory, scope: Scope) -> None:
    """An agent made or deleted between two page reads shifted every later page of an offset: the next
    page goes on after the last agent read (its id and owner: two users may each have an "a2", the
    caller's own first), as the Link header says."""
    mine = await client_for(scope)
    colleague = await client_for(Scope("colleague-" + uuid.uuid4().hex[:6], scope.app_id))
    for http, name in ((mine, "a1"), (mine, "a2"), (colleague, "a2"), (mine, "a3")):  # mine private, theirs shared
        made = await http.post("/api/v1/agents", json={"agent_id": name, "name": name, "shared": http is colleague})
        assert made.status_code == 201, made.text
    first = await mine.get("/api/v1/agents", params={"limit": 2})
    assert [(a["id"], a["owner_user_id"]) for a in first.json()] == [("a1", scope.user_id), ("a2", scope.user_id)]
    assert (await mine.post("/api/v1/agents", json={"agent_id": "a0", "name": "a0"})).status_code == 201
    assert (await mine.delete("/api/v1/agents/a1")).status_code == 204
    link = first.headers["link"]
    assert link.startswith("<agents?") and link.endswith('>; rel="next"'), link
    following = await mine.get("/api/v1/agents?" + link[len("<agents?"):-len('>; rel="next"')])
    assert following.status_code == 200, following.text
    assert [a["id"] for a in following.json()] == ["a2", "a3"]
    assert following.json()[0]["owner_user_id"] != scope.user_id and "link" in following.headers
    last = await mine.get("/api/v1/agents", params={"after": "a3", "after_owner": scope.user_id})
    assert last.json() == [] and "link" not in last.headers
    refused = await mine.get("/api/v1/agents", params={"after": "a3"})
    assert refused.status_code == 422 and "after_owner" in refused.text


async def test_the_agent_list_comes_a_page_at_a_time_as_summaries(http: httpx.AsyncClient, runtime: Runtime,
                                                                  scope: Scope) -> None:
    """Every user of an app lists its shared agents: a page held every agent whole (1,000 a user,
    each with 100,000 characters of instructions and as many of description)."""
    for name in ("a1", "a2", "a3"):
        made = await http.post("/api/v1/agents", json={"agent_id": name, "name": name, "description": "d" * 600,
                                                       "instructions": "the plan"})
        assert made.status_code == 201, made.text
    first = await http.get("/api/v1/agents", params={"limit": 2})
    assert first.status_code == 200 and [a["id"] for a in first.json()] == ["a1", "a2"]
    assert all("instructions" not in a and len(a["description"]) == 500 and a["description_truncated"]
               for a in first.json())
    assert [a["id"] for a in (await http.get("/api/v1/agents", params={"offset": 2})).json()] == ["a3"]
    assert (await http.get("/api/v1/agents", params={"limit": 101})).status_code == 422
    whole = (await http.get("/api/v1/agents/a1")).json()
    assert (len(whole["description"]), whole["instructions"]) == (600, "the plan")

    nul = await http.post("/api/v1/agents", json={"agent_id": "nul", "name": "Nul", "api_base": "http://a\u0000b/v1"})
    assert nul.status_code == 422 and "api_base" in nul.text, nul.text
    assert await rows(runtime.db, "SELECT agent_id FROM agents WHERE app_id = %s ORDER BY agent_id",
                      scope.app_id) == [{"agent_id": "a1"}, {"agent_id": "a2"}, {"agent_id": "a3"}]


async def test_a_messages_page_ends_at_its_byte_budget_and_links_the_next(http: httpx.AsyncClient,
                                                                         runtime: Runtime) -> None:
    """Up to 10,000 messages of 100,000 characters answered one read: a gigabyte built in the API."""
    root = (await http.post("/api/v1/sessions", json={"title": "long"})).json()["session"]
    async with runtime.db.tx() as conn:
        await conn.execute(
            "INSERT INTO thread_messages (session_id, role, content) "
            "SELECT %s, 'assistant', n || ':' || repeat('x', 1536 * 1024) FROM generate_series(1, 6) AS n",
            (root["session_id"],))

    pages, url = [], f"/api/v1/sessions/{root['session_id']}/messages?limit=5"
    while url:
        response = await http.get(url)
        assert response.status_code == 200, response.text
        pages.append([message["content"].split(":")[0] for message in response.json()])
        following = response.links.get("next")  # relative to the page's URL
        url = str(response.url.join(following["url"])) if following else None

    assert pages == [["1", "2", "3"], ["4", "5", "6"]]  # 4 MiB reached after three, then the rest


async def test_a_create_past_the_scopes_quota_is_a_429_and_writes_nothing(
        http: httpx.AsyncClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    held = len((await http.get("/api/v1/projects")).json())
    tag = uuid.uuid4().hex
    monkeypatch.setattr(runtime.settings, "max_projects_per_scope", held + 1)
    made = await http.post("/api/v1/projects", json={"name": f"last {tag}"})
    refused = await http.post("/api/v1/projects", json={"name": f"too many {tag}"})

    assert made.status_code == 201, made.text
    assert refused.status_code == 429 and "CANOPY_MAX_PROJECTS_PER_SCOPE" in refused.json()["detail"], refused.text
    names = await rows(runtime.db, "SELECT name FROM projects WHERE name LIKE %s", f"% {tag}")
    assert [row["name"] for row in names] == [f"last {tag}"]


async def test_many_probes_at_once_share_one_health_check(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz needs no key: fifty probes at once make one check of Ray (each held a thread of the
    executor actor lookups use, and a database connection, for as long as Ray was slow)."""
    asked = []

    def slow_and_counted() -> str:
        asked.append(1)
        time.sleep(0.5)  # a slow GCS
        return reachable()

    reachable = health._ray_reachable
    monkeypatch.setattr(health, "_ray_reachable", slow_and_counted)
    async with client(api.url, None) as anon:
        answers = await asyncio.gather(*(anon.get("/healthz") for _ in range(50)))

    assert [answer.json() for answer in answers] == [{"status": "ok", "database": "ok", "ray": "ok"}] * 50
    assert len(asked) <= 3, len(asked)  # one, or a few for probes that came after one ended


async def test_every_response_carries_the_security_headers(api: ApiServer, http: httpx.AsyncClient) -> None:
    """The UI shows what models wrote and keeps its key in the browser: its pages run only their own
    scripts and are framed by no other site. The API reference pages keep their CDN scripts."""
    async with client(api.url, None) as anon:
        page, script, docs = await anon.get("/"), await anon.get("/js/first-paint.js"), await anon.get("/docs")
    listed = await http.get("/api/v1/sessions")
    for response in (page, script, docs, listed):
        assert response.status_code == 200, response.text
        assert (response.headers["x-content-type-options"], response.headers["x-frame-options"],
                response.headers["referrer-policy"]) == ("nosniff", "DENY", "no-referrer")
    for response in (page, script, listed):
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "'unsafe" not in policy
    assert "content-security-policy" not in docs.headers
    # Those run on the UI's origin too: their scripts are pinned to a version and checked by hash.
    async with client(api.url, None) as anon:
        redoc = await anon.get("/redoc")
    for page_of_the_reference, pinned in ((docs, (reference.SWAGGER_JS, reference.SWAGGER_CSS)),
                                          (redoc, (reference.REDOC_JS,))):
        assert page_of_the_reference.status_code == 200
        for url, digest in pinned:
            assert f'"{url}" integrity="{digest}" crossorigin="anonymous"' in page_of_the_reference.text
        assert "@5/" not in page_of_the_reference.text and "@2/" not in page_of_the_reference.text
    assert "<script>" not in page.text  # the page has no inline script the policy would refuse
    # A path that only begins like a reference page's, and that the server decodes into the UI's own
    # page ("/docs/../"), keeps the policy.
    async with client(api.url, None) as anon:
        dressed = await anon.get("/docs%2F..%2F")
    assert dressed.status_code == 404 or "script-src 'self'" in dressed.headers.get("content-security-policy", "")


async def test_an_api_replicas_pool_is_sized_by_a_setting_its_actors_do_not_inherit(runtime: Runtime) -> None:
    """A replica's pool was sized by CANOPY_DB_POOL_MAX=16 in its runtime_env, which Ray hands down to
    every actor the replica makes: under Serve alone (serve.yaml, kuberay.yaml) the replica makes the
    sweeper and the session hosts, and a host's pool (twice that setting) grew to 32 connections. The
    replica's own pool is CANOPY_API_DB_POOL_MAX (tests/test_deploy_configs.py: the files set no other)."""
    app = create_app(settings=Settings(api_db_pool_max=3))
    async with app.router.lifespan_context(app):
        assert app.state.runtime.db.pool.max_size == 3


async def test_a_body_that_trickles_in_is_answered_408_and_its_connection_closed(runtime: Runtime,
                                                                                scope: Scope) -> None:
    """A body is read before the key is checked, and the read had no deadline: a client sending a
    byte now and then held one of the replica's request slots (Serve's proxy streams the body on)
    for as long as it liked, a thousand such clients every slot. Past ``api_body_seconds`` it is
    answered 408, its connection closed, and nothing is made; a body that comes whole still works."""
    settings = runtime.settings.model_copy(update={"api_body_seconds": 1.5})
    key = await runtime.create_api_key(scope)
    async with uvicorn_server(create_app(runtime, settings=settings, admin_token=ADMIN_TOKEN)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"title": "trickled"}'
        writer.write(b"POST /api/v1/sessions HTTP/1.1\r\nHost: canopy\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + key.encode() + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for byte in body[:5]:  # a byte every 0.2 s until just before the deadline, never the whole body
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)
        answer = await asyncio.wait_for(reader.read(), timeout=10)  # to the end: the server closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"request body not received whole within 1.5 s" in answer
        async with client(server.url, key) as http:
            made = await http.post("/api/v1/sessions", json={"title": "whole"})
        assert made.status_code == 201, made.text
    titles = await rows(runtime.db, "SELECT title FROM sessions WHERE user_id = %s AND app_id = %s",
                        scope.user_id, scope.app_id)
    assert titles == [{"title": "whole"}]


async def test_one_keys_requests_are_served_a_few_at_a_time(runtime: Runtime, scope: Scope) -> None:
    """A replica has a few database connections (CANOPY_API_DB_POOL_MAX) for every key's requests,
    and one key's parallel reads took every one of them: every other key's requests waited, then
    were answered 503. A key's requests are served ``api_key_concurrency`` at a time: the others
    wait for a turn, then are answered 429; another key's go on. Seen here from the database: the
    requests waiting on a table's lock are those that got a connection. (A turn lasts until the
    response starts: the event stream tests keep streams working under it.)"""
    settings = runtime.settings.model_copy(update={"api_key_concurrency": 2, "api_db_wait_seconds": 2.0})
    busy, other = await runtime.create_api_key(scope), await runtime.create_api_key(
        Scope(user_id=f"other-{uuid.uuid4().hex[:8]}", app_id=scope.app_id))
    async with uvicorn_server(create_app(runtime, settings=settings, admin_token=ADMIN_TOKEN)) as server, \
            client(server.url, busy) as busy_http, client(server.url, other) as other_http:
        for http in (busy_http, other_http):  # each key checked and cached before the table is locked
            assert (await http.get("/api/v1/projects")).status_code == 200
        async with await psycopg.AsyncConnection.connect(runtime.database_url) as locker:
            await locker.execute("LOCK TABLE projects IN ACCESS EXCLUSIVE MODE")
            # However the bearer is spelled, it is the key the route checks, and so its share.
            spellings = [f"Bearer {busy}", f"bearer   {busy}", f"BEARER {busy}"]
            calls = [asyncio.create_task(busy_http.get("/api/v1/projects", headers={"Authorization": spelling}))
                     for spelling in spellings] + [asyncio.create_task(other_http.get("/api/v1/projects"))]

            async def waiting() -> int:  # requests with a connection, waiting for the lock (pg_locks is
                # read live; pg_stat_activity would be the snapshot this transaction took first)
                found = await (await locker.execute(
                    "SELECT count(*) FROM pg_locks WHERE relation = 'projects'::regclass AND NOT granted")).fetchone()
                return int(found[0]) if found else 0

            deadline = time.monotonic() + 30
            while await waiting() < 3:
                assert time.monotonic() < deadline, "the requests never reached the database"
                await asyncio.sleep(0.05)
            done, _ = await asyncio.wait(calls, timeout=20, return_when=asyncio.FIRST_COMPLETED)
            [refused] = done  # the busy key's third, after its wait for a turn
            assert refused.result().status_code == 429, refused.result().text
            assert "CANOPY_API_KEY_CONCURRENCY" in refused.result().json()["detail"]
            assert refused.result().headers["retry-after"] == "1"
            assert await waiting() == 3  # two of the busy key's, one of the other's
            await locker.rollback()
        statuses = [answer.status_code for answer in await asyncio.gather(*calls)]
    assert sorted(statuses) == [200, 200, 200, 429] and statuses[3] == 200, statuses
