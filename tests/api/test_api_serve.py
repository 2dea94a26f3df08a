"""A whole cooperation scenario driven only over HTTP, against the app deployed on Ray Serve as
``canopy up`` deploys it (in the test session's own Ray cluster, on a free loopback port)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from tests.api.helpers import ADMIN_TOKEN, client, collect_events, rows, served


@pytest.fixture(scope="module")
async def serve_url(runtime: Runtime) -> AsyncIterator[str]:
    async with served(runtime, ADMIN_TOKEN) as url:
        yield url


async def test_cooperation_scenario_over_http_on_serve(serve_url: str, runtime: Runtime) -> None:
    async with client(serve_url, ADMIN_TOKEN) as admin:
        health = await admin.get("/healthz")
        assert health.json()["status"] == "ok", health.text
        minted = await admin.post("/api/v1/admin/keys", json={"user_id": f"u-{uuid.uuid4().hex[:8]}",
                                                               "app_id": "serve-test"})
        assert minted.status_code == 201, minted.text
    key = minted.json()["api_key"]
    text = script(
        call(create("a", script(say("A done", delay_ms=300))), create("b", script(say("B done", delay_ms=300)))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
        say("children said ${2.results.0.output} and ${2.results.1.output}"),
    )
    async with client(serve_url, key) as http:
        created = await http.post("/api/v1/sessions", json={"input": text, "title": "serve scenario"})
        assert created.status_code == 201, created.text
        root = created.json()["session"]
        receipt = created.json()["input"]
        assert (root["path"], root["depth"], receipt["status"]) == ("/root", 0, "started")
        tree_id = root["tree_id"]

        def root_done(event: dict) -> bool:
            return event["kind"] == "turn_completed" and event["session_id"] == root["session_id"]

        events = await collect_events(http, f"/api/v1/trees/{tree_id}/events", until=root_done, timeout=90)
        assert set(events[0]) >= {"cursor", "kind", "session_id", "turn_id", "run_id", "payload", "created_at"}
        stored = await rows(runtime.db, "SELECT cursor FROM events WHERE tree_id = %s AND cursor <= %s "
                            "ORDER BY cursor", uuid.UUID(tree_id), events[-1]["cursor"])
        assert [e["cursor"] for e in events] == [r["cursor"] for r in stored]

        result = (await http.get(f"/api/v1/inputs/{receipt['input_id']}/result")).json()
        assert (result["status"], result["terminal"]) == ("completed", True)
        assert result["output"] == "children said A done and B done"
        by_turn = (await http.get(f"/api/v1/turns/{result['turn_id']}/result")).json()
        assert by_turn == result

        summary = (await http.get(f"/api/v1/trees/{tree_id}")).json()
        assert sorted(m["path"] for m in summary["members"]) == ["/root", "/root/a", "/root/b"]
        assert {m["turn_status"] for m in summary["members"]} == {"completed"}
        assert summary["slots_in_use"] == 0 and summary["slot_limit"] == 4

        messages = (await http.get(f"/api/v1/sessions/{root['session_id']}/messages")).json()
        assert [m["role"] for m in messages][:2] == ["user", "assistant"]
        assert messages[1]["tool_calls"][0]["name"] == "create_session"
        assert messages[-1]["content"] == "children said A done and B done"
        child = next(m for m in summary["members"] if m["path"] == "/root/a")
        child_messages = (await http.get(f"/api/v1/sessions/{child['session_id']}/messages")).json()
        assert child_messages[-1]["content"] == "A done"
        assert child_messages[0]["origin"]["kind"] == "session"

        session = (await http.get(f"/api/v1/sessions/{root['session_id']}")).json()
        assert (session["activity"], session["current_turn_id"]) == ("idle", None)
        assert (await http.get("/metrics")).status_code == 401  # an API key does not read metrics
        async with client(serve_url, ADMIN_TOKEN) as admin:
            metrics = (await admin.get("/metrics")).text
        assert 'canopy_model_calls_total{model="canopy/scripted",outcome="ok"}' in metrics
        assert json.loads(json.dumps(session))["origin"] == {"kind": "human"}
