"""ModelGateway against the real scripted endpoint through real litellm, as an object and as a Ray actor."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import ray

from actors.model_gateway import ModelError, ModelGateway
from actors.scripted import builders
from actors.scripted.server import ScriptedModelServer, serve_scripted_model

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("create_session", "wait_inputs", "run_command")
]
CANCEL_BOUND_SECONDS = 5.0


def scripted(steps: list[dict[str, Any]], task: str = "Do the thing.") -> list[dict[str, Any]]:
    return [{"role": "user", "content": builders.script(*steps, task=task)}]


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def wait_until(condition: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway") / "requests.jsonl"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gateway(log_path: Path) -> AsyncIterator[ModelGateway]:
    gw = ModelGateway(log_path=str(log_path), timeout_seconds=30, retries=2)
    yield gw
    await gw.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def own_server() -> AsyncIterator[ScriptedModelServer]:
    server = await serve_scripted_model()
    yield server
    await server.stop()


async def test_complete_returns_tool_calls_and_usage(gateway: ModelGateway, log_path: Path) -> None:
    messages = scripted([
        {"call": [{"name": "create_session", "args": {"name": "a", "description": "first"}},
                  {"name": "run_command", "args": {"command": "ls"}}]},
        {"say": "created ${0.input_id}"},
    ])
    result = await gateway.complete(model="canopy/scripted", messages=messages, tools=TOOLS)

    message = result["message"]
    assert message["role"] == "assistant" and message["content"] is None
    assert [(c["name"], c["arguments"]) for c in message["tool_calls"]] == [
        ("create_session", {"name": "a", "description": "first"}),
        ("run_command", {"command": "ls"}),
    ]
    assert all(isinstance(c["id"], str) and c["id"] for c in message["tool_calls"])
    assert result["usage"]["prompt_tokens"] > 0 and result["usage"]["completion_tokens"] > 0
    assert result["cost_usd"] == 0.0 and result["latency_ms"] > 0 and result["model"] == "canopy/scripted"
    assert await gateway.request_log_path() == str(log_path)
    assert (await gateway.scripted_base_url()).startswith("http://127.0.0.1:")

    # The returned message goes back into the history as is (Canopy's shape, not OpenAI's).
    history = [*messages, message]
    history += [
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": {"input_id": "in-9"}},
        {"role": "tool", "tool_call_id": message["tool_calls"][1]["id"], "content": "exit 0"},
    ]
    follow_up = await gateway.complete(model="canopy/scripted", messages=history, tools=TOOLS)
    assert follow_up["message"] == {"role": "assistant", "content": "created in-9", "tool_calls": []}


async def test_fail_raises_model_error_without_retry(gateway: ModelGateway, log_path: Path) -> None:
    before = len(log_lines(log_path))
    with pytest.raises(ModelError, match="the provider said no"):
        await gateway.complete(model="canopy/scripted", messages=scripted([{"fail": "the provider said no"}]),
                               tools=TOOLS)
    assert len(log_lines(log_path)) == before + 1, "a non-transient error is not retried"


async def test_transient_error_is_retried_then_reported() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: connections are refused
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    gw = ModelGateway(timeout_seconds=5, retries=1)
    started = time.monotonic()
    with pytest.raises(ModelError, match="after 2 attempt"):
        await gw.complete(model="openai/scripted", messages=scripted([{"say": "x"}]), tools=None,
                          api_key="x", api_base=f"http://127.0.0.1:{closed_port}/v1")
    assert time.monotonic() - started >= 0.5, "backs off before retrying"


async def test_other_models_pass_through_with_key_and_base(
    gateway: ModelGateway, own_server: ScriptedModelServer
) -> None:
    result = await gateway.complete(
        model="openai/scripted", messages=scripted([{"say": "direct"}]), tools=None,
        api_key="sk-test", api_base=own_server.base_url,
    )
    assert result["message"]["content"] == "direct"
    assert result["cost_usd"] == 0.0, "an unpriced model costs 0 rather than failing"


async def test_cancellation_aborts_the_http_call(
    gateway: ModelGateway, own_server: ScriptedModelServer
) -> None:
    call = asyncio.create_task(gateway.complete(
        model="openai/scripted", messages=scripted([{"say": "x", "delay_ms": 10000}]), tools=None,
        api_key="x", api_base=own_server.base_url,
    ))
    await wait_until(lambda: own_server.in_flight_requests == 1)
    await asyncio.sleep(0.5)

    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert time.monotonic() - started < 2.0
    # The server sees the hang-up: the request is gone long before its 10 s delay.
    await wait_until(lambda: own_server.in_flight_requests == 0, within=2.0)


# ---------------------------------------------------------------------------
# As a Ray actor
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    if ray.is_initialized():  # another suite's Ray (e.g. the runtime fixture): use it, leave it running
        yield
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}},
    )
    yield
    ray.shutdown()


async def test_as_ray_actor(ray_cluster: None, tmp_path: Path) -> None:
    log_path = tmp_path / "actor-requests.jsonl"
    actor = ray.remote(ModelGateway).options(max_concurrency=1000, num_cpus=0).remote(
        log_path=str(log_path), timeout_seconds=30, retries=2
    )
    script = [{"call": [{"name": "wait_inputs", "args": {"input_ids": ["in-1"]}}]}]
    result = await actor.complete.remote(model="canopy/scripted", messages=scripted(script), tools=TOOLS)
    assert [(c["name"], c["arguments"]) for c in result["message"]["tool_calls"]] == [
        ("wait_inputs", {"input_ids": ["in-1"]})
    ]

    with pytest.raises(ModelError, match="rate card missing"):
        await actor.complete.remote(
            model="canopy/scripted", messages=scripted([{"fail": "rate card missing"}]), tools=None
        )
    assert len(log_lines(log_path)) == 2, "the failure was not retried"

    ref = actor.complete.remote(model="canopy/scripted", messages=scripted([{"say": "x", "delay_ms": 10000}]),
                                tools=None)
    await wait_until(lambda: len(log_lines(log_path)) == 3)
    await asyncio.sleep(0.5)
    started = time.monotonic()
    ray.cancel(ref)
    with pytest.raises((ray.exceptions.TaskCancelledError, asyncio.CancelledError)):
        await asyncio.wait_for(ref, timeout=CANCEL_BOUND_SECONDS)
    elapsed = time.monotonic() - started
    assert elapsed < CANCEL_BOUND_SECONDS, f"cancellation took {elapsed:.2f}s"
    # ray.cancel reached the coroutine: its HTTP request was dropped, not left to run for 10 s.
    deadline = time.monotonic() + 2.0
    while await actor.scripted_in_flight_requests.remote() != 0:
        assert time.monotonic() < deadline, "the cancelled request is still in flight"
        await asyncio.sleep(0.05)

    after = await actor.complete.remote(model="canopy/scripted", messages=scripted([{"say": "still here"}]),
                                        tools=None)
    assert after["message"]["content"] == "still here"
    ray.kill(actor)
