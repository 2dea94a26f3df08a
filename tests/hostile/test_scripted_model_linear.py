"""Hostile request content for the scripted model (issue 15 §9): the gateway's event loop serves every
model call of the cluster, so the scripted model's work on one request must grow linearly with its
size, and content beyond the size limits is refused with HTTP 400 before any of that work.

Speed belongs in benchmarks, so the linear tests assert a scaling ratio, not a time: the work on an
adversarial input of size n and of size 8n (best of 3 each) grows by less than GROWTH_LIMIT (linear
work grows ~8x, quadratic ~64x, a backtracking line regex over newlines ~500x).
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # after the env var: no network fetch of the price map

from actors.scripted import Limits, builders
from actors.scripted.model import plan_reply
from actors.scripted.server import ScriptedModelServer, serve_scripted_model
from persistence.settings import Settings

litellm.suppress_debug_info = True

pytestmark = pytest.mark.asyncio(loop_scope="session")

GROWTH = 8
GROWTH_LIMIT = 20.0
# Each measurement repeats the work until the smaller size takes this long, so that timer resolution
# and the constant cost of a request do not decide the ratio.
MIN_WINDOW_SECONDS = 0.1
DEFAULT_LIMITS = Limits.from_settings(Settings())
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
         for n in ("create_session", "wait_inputs", "run_command")]


def _system(text: str) -> dict[str, Any]:
    """A request whose system prompt (where the model reads its identity) is ``text``."""
    return {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "Do the thing."}]}


def _scripted(steps: list[dict[str, Any]], *history: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    text = builders.script(*steps, task="Do the thing.")
    return {"messages": [{"role": "user", "content": text}, *history], "stream": stream}


def _after_one_call(result: Any, step: dict[str, Any]) -> dict[str, Any]:
    """A request at the script's second step, after one tool call whose result is ``result``."""
    call = {"id": "call_0", "type": "function", "function": {"name": "run_command", "arguments": "{}"}}
    return _scripted([{"call": [{"name": "run_command"}]}, step],
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_0", "content": json.dumps(result)})


# name -> (n, request body of size ~n). The identity shapes over newlines are what backtracking line
# regexes take cubic time on: their n is small enough for such a parse to fail in seconds, not minutes.
SHAPES: dict[str, tuple[int, Callable[[int], dict[str, Any]]]] = {
    "many_newlines": (128, lambda n: _system("\n" * n)),
    "deep_role_prefix": (128, lambda n: _system("role:" + " \n" * n + "x")),
    "whitespace_run_without_match": (2048, lambda n: _system(" " * n + "x")),
    "name_with_whitespace_run": (2048, lambda n: _system("name: x" + " " * n + "y")),
    "unclosed_references": (2048, lambda n: _scripted([{"say": "${0.a" * n}])),
    "repeated_references": (512, lambda n: _after_one_call({"a": 1, "pad": "x" * 16 * n}, {"say": "${0.a}" * n})),
    "many_parallel_calls": (256, lambda n: _scripted([{"call": [{"name": "run_command"}] * n}])),
    "streamed_words": (2048, lambda n: _scripted([{"say": "a " * n}], stream=True)),
}


async def _elapsed(work: Callable[[], Awaitable[None]], reps: int, budget: float = math.inf) -> float:
    """Seconds for ``reps`` runs of ``work``, stopping early once over ``budget``."""
    started = time.perf_counter()
    for _ in range(reps):
        await work()
        if time.perf_counter() - started > budget:
            break
    return time.perf_counter() - started


async def growth(work: Callable[[dict[str, Any]], Awaitable[None]], shape: str) -> str | None:
    """None when the work on the shape's 8n input grows by less than GROWTH_LIMIT over its n input,
    else a description of the growth."""
    n, build = SHAPES[shape]
    small_body, large_body = build(n), build(GROWTH * n)

    async def small() -> None:
        await work(small_body)

    async def large() -> None:
        await work(large_body)

    await small()  # the first run pays one-time costs (a connection, first code paths)
    # As timeit does: the collector runs at allocation-count thresholds, so whether the n or the 8n
    # run pays for a full collection of the whole process would be chance.
    gc.collect()
    gc.disable()
    try:
        reps = 1
        while await _elapsed(small, reps) < MIN_WINDOW_SECONDS:
            reps *= 2
        small_seconds = min([await _elapsed(small, reps) for _ in range(3)])
        # Past twice the limit the answer is known: each try stops there rather than wait minutes for a
        # cubic parse, and the best of three tries keeps one stall of a busy machine from deciding it.
        budget = 2 * GROWTH_LIMIT * small_seconds
        large_seconds = min([await _elapsed(large, reps, budget) for _ in range(3)])
    finally:
        gc.enable()
    ratio = large_seconds / small_seconds
    if ratio < GROWTH_LIMIT:
        return None
    return f"{shape}: n={n} x{reps} took {small_seconds:.4f} s, 8n took {large_seconds:.4f} s ({ratio:.0f}x)"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server() -> AsyncIterator[ScriptedModelServer]:
    running = await serve_scripted_model()
    yield running
    await running.stop()


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_parse_grows_linearly(shape: str) -> None:
    async def parse(body: dict[str, Any]) -> None:
        plan_reply(body["messages"], TOOLS, DEFAULT_LIMITS)

    assert await growth(parse, shape) is None


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_request_grows_linearly(server: ScriptedModelServer, shape: str) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        async def request(body: dict[str, Any]) -> None:
            response = await client.post(server.base_url + "/chat/completions", json={**body, "tools": TOOLS})
            assert response.status_code == 200, response.text

        assert await growth(request, shape) is None


# Small limits, so that content beyond them is cheap to send.
LIMITS = Limits(request_bytes=64 * 1024, script_bytes=8 * 1024)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def limited(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ScriptedModelServer]:
    running = await serve_scripted_model(log_path=tmp_path_factory.mktemp("limited") / "requests.jsonl",
                                         limits=LIMITS)
    yield running
    await running.stop()


async def complete(server: ScriptedModelServer, text: str, **extra: Any) -> Any:
    return await litellm.acompletion(
        model="openai/scripted", api_base=server.base_url, api_key="x", num_retries=0, max_retries=0,
        messages=[{"role": "user", "content": text}], **extra)


def logged(server: ScriptedModelServer) -> list[dict[str, Any]]:
    """The requests the server read, from its request log."""
    assert server.log_path is not None
    lines = server.log_path.read_text().splitlines() if server.log_path.exists() else []
    return [json.loads(line) for line in lines]


async def test_oversized_script_is_refused_unparsed(limited: ScriptedModelServer) -> None:
    # Not valid JSON either: an error that names the size shows the script was never parsed.
    oversized = builders.script({"say": "x" * LIMITS.script_bytes}) + "]"
    with pytest.raises(litellm.BadRequestError, match=f"script after '#!script' is over {LIMITS.script_bytes} bytes"):
        await complete(limited, oversized)
    # The limit counts UTF-8 bytes, not characters.
    wide = builders.script({"say": "é" * (LIMITS.script_bytes // 2)})
    with pytest.raises(litellm.BadRequestError, match=f"over {LIMITS.script_bytes} bytes"):
        await complete(limited, wide)

    within = "y" * (LIMITS.script_bytes - 100)
    response = await complete(limited, builders.script({"say": within}))
    assert response.choices[0].message.content == within


async def test_oversized_request_body_is_refused_unread(limited: ScriptedModelServer) -> None:
    before = len(logged(limited))
    text = "z" * LIMITS.request_bytes
    with pytest.raises(litellm.BadRequestError, match=f"request body is over {LIMITS.request_bytes} bytes"):
        await complete(limited, text)

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: refused while it is read
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(LIMITS.request_bytes // 1024 + 1):
            yield b"z" * 1024
        yield b'"}]}'

    async with httpx.AsyncClient() as client:
        response = await client.post(limited.base_url + "/chat/completions", content=chunked())
        assert response.status_code == 400
        assert f"over {LIMITS.request_bytes} bytes" in response.json()["error"]["message"]
        # The server still answers (the connection was not left half-read).
        health = await client.get(limited.base_url.removesuffix("/v1") + "/healthz")
        assert health.json() == {"status": "ok"}
    assert len(logged(limited)) == before, "a refused body is never read, so never logged"


async def test_reference_expansion_is_bounded(limited: ScriptedModelServer) -> None:
    # A script of a few bytes repeating a reference to a large tool result would make a reply of
    # gigabytes; the expansion is bounded by the request limit.
    steps = [{"call": [{"name": "run_command", "args": {}}]}, {"say": "${0}" * 100}]
    first = await complete(limited, builders.script(*steps))
    [call] = first.choices[0].message.tool_calls
    history = [{"role": "user", "content": builders.script(*steps)}, first.choices[0].message.model_dump(),
               {"role": "tool", "tool_call_id": call.id, "content": "r" * 1024}]
    with pytest.raises(litellm.BadRequestError, match=f"expand to over {LIMITS.request_bytes} characters"):
        await litellm.acompletion(model="openai/scripted", api_base=limited.base_url, api_key="x", num_retries=0,
                                  max_retries=0, messages=history)
    steps[1] = {"say": "${0}" * 10}
    history[0] = {"role": "user", "content": builders.script(*steps)}
    reply = await litellm.acompletion(model="openai/scripted", api_base=limited.base_url, api_key="x",
                                      num_retries=0, max_retries=0, messages=history)
    assert reply.choices[0].message.content == "r" * 1024 * 10


async def test_deeply_nested_request_is_refused(limited: ScriptedModelServer) -> None:
    nested = "[" * 20_000 + "]" * 20_000
    async with httpx.AsyncClient() as client:
        body = await client.post(limited.base_url + "/chat/completions", content=nested)
        script = await client.post(limited.base_url + "/chat/completions",
                                   json={"messages": [{"role": "user", "content": "t\n#!script\n" + "[" * 4000}]})
    assert body.status_code == 400 and "nested too deeply" in body.json()["error"]["message"]
    assert script.status_code == 400 and "nested too deeply" in script.json()["error"]["message"]
