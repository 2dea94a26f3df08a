"""Schemathesis against /openapi.json: every operation, authenticated, valid and invalid data; no 5xx.

Half of the generated cases are pointed at real objects (a root session and a tree parked on a
question), so the fuzz reaches the handlers' state checks and writes, not only the 404s of
random ids. Inputs go to a session whose agent's model fails at once, and new roots with an
input use that agent too: the fuzz exercises the API, not hundreds of model demos.
"""

from __future__ import annotations

import asyncio
import collections
import random
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from actors.scripted import call, say, script
from tests.actors.replay_server import ReplayServer, fail
from tests.api.conftest import ApiServer
from tests.api.helpers import poll

EXAMPLES_PER_OPERATION = 12  # per operation and mode: ~1,400 requests in all
# An agent whose provider answers 404: not a failure to retry, so a Turn with it fails at once (an
# unknown provider is refused when the agent is created).
BROKEN_MODEL = "openai/none"
# The live streams never end on a real object: only their 404/422 answers are fuzzed here.
STREAMING = ("/api/v1/sessions/{session_id}/events", "/api/v1/trees/{tree_id}/events")


async def _objects(replay: ReplayServer, http: httpx.AsyncClient) -> dict[str, list[str]]:
    replay.script("none", then=fail(404))
    assert (await http.post("/api/v1/agents", json={"agent_id": "broken", "name": "Broken", "model": BROKEN_MODEL,
                                                     "api_base": replay.base_url})).status_code == 201
    project = (await http.post("/api/v1/projects", json={"name": "fuzz"})).json()["project_id"]
    idle = (await http.post("/api/v1/sessions", json={"agent_id": "broken", "project_id": project})).json()
    parked = (await http.post("/api/v1/sessions", json={
        "input": script(call(("ask_user", {"question": "q?"})), say("done"))})).json()
    tree_id = parked["session"]["tree_id"]

    async def inbox() -> list:
        return (await http.get(f"/api/v1/trees/{tree_id}/requests")).json()

    request = (await poll(inbox))[0]
    return {"session_id": [idle["session"]["session_id"]], "tree_id": [tree_id, idle["session"]["tree_id"]],
            "turn_id": [parked["input"]["turn_id"]], "input_id": [parked["input"]["input_id"]],
            "request_id": [request["id"]], "agent_id": ["broken"], "project_id": [project]}


def _aim(case: Any, real: dict[str, list[str]], rng: random.Random) -> None:
    """Point the case at real objects (half the time) and keep it from starting model demos."""
    if case.operation.path not in STREAMING and rng.random() < 0.5:
        for name in list(case.path_parameters):
            if name in real:
                case.path_parameters[name] = rng.choice(real[name])
    body = case.body
    if case.operation.path == "/api/v1/sessions" and case.method.upper() == "POST" and isinstance(body, dict):
        if isinstance(body.get("input"), str) and body.get("agent_id") is None:
            body["agent_id"] = "broken"


def _run(operation: Any, mode: GenerationMode, call: Any, real: dict[str, list[str]],
         failures: list[str]) -> None:
    """Up to EXAMPLES_PER_OPERATION cases of one operation in one generation mode."""
    rng = random.Random(f"{operation.label}{mode}")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        _aim(case, real, rng)
        response = call(case)
        try:
            case.validate_response(response, checks=[not_a_server_error])
        except Exception as error:
            failures.append(f"{case.method} {case.formatted_path}: {response.status_code} "
                            f"{response.text[:300]} ({type(error).__name__})")

    try:
        check()
    except Unsatisfiable:
        pass  # nothing to make invalid (an operation without parameters or body)
    except Exception as error:  # one operation's generation problem must not hide the others
        failures.append(f"{operation.label} [{mode.value}]: {type(error).__name__}: {error}")


def _fuzz(base_url: str, api_key: str, real: dict[str, list[str]],
          statuses: collections.Counter[int]) -> list[str]:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    headers = {"Authorization": f"Bearer {api_key}"}
    failures: list[str] = []

    def call(case: Any) -> Any:
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        statuses[response.status_code] += 1
        return response

    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            failures.append(f"invalid operation in the schema: {result.err()}")
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _run(result.ok(), mode, call, real, failures)
    return failures


async def test_schemathesis_finds_no_server_errors(api: ApiServer, http: httpx.AsyncClient,
                                                   replay: ReplayServer) -> None:
    real = await _objects(replay, http)
    api_key = http.headers["Authorization"].removeprefix("Bearer ")
    statuses: collections.Counter[int] = collections.Counter()
    failures = await asyncio.to_thread(_fuzz, api.url, api_key, real, statuses)
    assert not failures, "\n".join(failures[:20])
    print("schemathesis status codes:", dict(sorted(statuses.items())))
    assert sum(statuses.values()) > 300 and statuses[200] + statuses[201] + statuses[202] > 50
    assert (await http.get("/healthz")).status_code == 200
