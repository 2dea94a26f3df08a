"""The scripted model, reached over real HTTP through real litellm (as Canopy reaches it)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # after the env var: no network fetch of the price map

from actors.gateways import gateway_options, scripted_log_path
from actors.scripted import FINAL_TEXT, builders
from actors.scripted.server import ScriptedModelServer, serve_scripted_model
from persistence.settings import Settings

litellm.suppress_debug_info = True  # expected provider errors would print help banners

# One loop for the whole session (as pyproject configures): litellm caches HTTP clients,
# which are bound to the loop that made them.
pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOL_NAMES = ("create_session", "wait_inputs", "run_command", "send_message")
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in TOOL_NAMES
]
ROOT_SYSTEM = "You are a Canopy session.\nIdentity:\nname: main\nrole: root\ndepth: 0"
CHILD_SYSTEM = "You are a Canopy session.\nIdentity:\nname: research\nrole: child\ndepth: 1"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ScriptedModelServer]:
    log_path = tmp_path_factory.mktemp("scripted") / "requests.jsonl"
    running = await serve_scripted_model(log_path=log_path)
    yield running
    await running.stop()


def scripted(steps: list[dict[str, Any]], task: str = "Do the thing.") -> str:
    return builders.script(*steps, task=task)


async def complete(
    server: ScriptedModelServer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = TOOLS,
    **extra: Any,
) -> Any:
    return await litellm.acompletion(
        model="openai/scripted", api_base=server.base_url, api_key="x", messages=messages, tools=tools,
        num_retries=0, max_retries=0, **extra,
    )


def answered(messages: list[dict[str, Any]], response: Any, results: list[Any]) -> list[dict[str, Any]]:
    """The history after the model's reply and, for each of its tool calls, the given result."""
    message = response.choices[0].message
    history = [*messages, message.model_dump(exclude_none=True)]
    for call, result in zip(message.tool_calls or [], results, strict=True):
        content = result if isinstance(result, str) else json.dumps(result)
        history.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return history


def calls_of(response: Any) -> list[tuple[str, dict[str, Any]]]:
    calls = response.choices[0].message.tool_calls
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


async def test_call_step_returns_parallel_tool_calls(server: ScriptedModelServer) -> None:
    script = [{"call": [
        {"name": "create_session", "args": {"name": "a", "description": "first"}},
        {"name": "run_command", "args": {"command": "ls -la"}},
    ]}]
    response = await complete(server, [{"role": "user", "content": scripted(script)}])

    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(response) == [
        ("create_session", {"name": "a", "description": "first"}),
        ("run_command", {"command": "ls -la"}),
    ]
    ids = [c.id for c in choice.message.tool_calls]
    assert len(set(ids)) == 2 and all(c.type == "function" for c in choice.message.tool_calls)
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0

    again = await complete(server, [{"role": "user", "content": scripted(script)}])
    assert [c.id for c in again.choices[0].message.tool_calls] == ids, "ids are deterministic"


async def test_references_resolve_from_tool_results(server: ScriptedModelServer) -> None:
    script = [
        {"call": [{"name": "create_session", "args": {"name": "a"}}, {"name": "run_command", "args": {}}]},
        {"call": [{"name": "wait_inputs", "args": {
            "input_ids": ["${0.input_id}"],
            "typed_list": "${0.ids}",
            "typed_int": "${0.ids.1}",
            "embedded": "first=${0.input_id} nested=${0.meta.depth} list=${0.ids}",
            "whole": "${0}",
            "raw": "${1}",
            "escaped": "a child script may say $${0.output} itself",
            "escaped_exact": "$${1}",
        }}]},
        {"say": "done with ${0.input_id} and ${1}"},
    ]
    messages = [{"role": "user", "content": scripted(script)}]
    first = await complete(server, messages)
    created = {"input_id": "in-1", "ids": [7, 8], "meta": {"depth": 1}}
    messages = answered(messages, first, [created, "plain text, not JSON"])

    second = await complete(server, messages)
    [(name, args)] = calls_of(second)
    assert name == "wait_inputs"
    assert args["input_ids"] == ["in-1"]
    assert args["typed_list"] == [7, 8]
    assert args["typed_int"] == 8
    assert args["embedded"] == "first=in-1 nested=1 list=[7, 8]"
    assert json.loads(args["whole"]) == created
    assert args["raw"] == "plain text, not JSON"
    assert args["escaped"] == "a child script may say ${0.output} itself"
    assert args["escaped_exact"] == "${1}"

    messages = answered(messages, second, [{"results": [], "timed_out": False}])
    third = await complete(server, messages)
    assert third.choices[0].message.content == "done with in-1 and plain text, not JSON"
    assert third.choices[0].finish_reason == "stop"


async def test_missing_reference_is_a_clear_error(server: ScriptedModelServer) -> None:
    script = [
        {"call": [{"name": "run_command", "args": {}}]},
        {"say": "${0.nope}"},
    ]
    messages = [{"role": "user", "content": scripted([{"say": "${3.input_id}"}])}]
    with pytest.raises(litellm.BadRequestError, match="reference to tool call 3"):
        await complete(server, messages)

    messages = [{"role": "user", "content": scripted(script)}]
    first = await complete(server, messages)
    with pytest.raises(litellm.BadRequestError, match=r"reference \$\{0.nope\}: no 'nope'"):
        await complete(server, answered(messages, first, [{"exit_code": 0}]))


async def test_say_then_script_end(server: ScriptedModelServer) -> None:
    messages = [{"role": "user", "content": scripted([{"say": "all done"}])}]
    first = await complete(server, messages)
    assert first.choices[0].message.content == "all done"
    assert not first.choices[0].message.tool_calls

    after = await complete(server, answered(messages, first, []))
    assert after.choices[0].message.content == FINAL_TEXT


async def test_fail_step_raises_provider_error(server: ScriptedModelServer) -> None:
    messages = [{"role": "user", "content": scripted([{"fail": "quota exhausted for project X"}])}]
    with pytest.raises(litellm.BadRequestError, match="quota exhausted for project X"):
        await complete(server, messages)


async def test_invalid_script_is_rejected(server: ScriptedModelServer) -> None:
    messages = [{"role": "user", "content": "task\n#!script\n[{\"say\": "}]
    with pytest.raises(litellm.BadRequestError, match="not valid JSON"):
        await complete(server, messages)
    messages = [{"role": "user", "content": scripted([{"shout": "x"}])}]
    with pytest.raises(litellm.BadRequestError, match="exactly one of 'call', 'say', 'fail'"):
        await complete(server, messages)


async def test_delay_ms_is_observed(server: ScriptedModelServer) -> None:
    messages = [{"role": "user", "content": scripted([{"say": "slow", "delay_ms": 400}])}]
    started = time.monotonic()
    response = await complete(server, messages)
    assert time.monotonic() - started >= 0.4
    assert response.choices[0].message.content == "slow"


async def test_stream_ms_spreads_the_text_over_time(server: ScriptedModelServer) -> None:
    text = "one two three four five six seven eight"
    messages = [{"role": "user", "content": scripted([{"say": text, "stream_ms": 800}])}]
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    async for chunk in await complete(server, messages, stream=True):
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            arrivals.append((time.monotonic() - started, piece))
    assert "".join(piece for _, piece in arrivals) == text
    # From the first word to the last most of the 800 ms pass: a watcher sees the text grow.
    assert arrivals[-1][0] - arrivals[0][0] >= 0.6, arrivals
    plain = await complete(server, messages)
    assert plain.choices[0].message.content == text


async def test_a_steps_timing_is_a_finite_bounded_number(server: ScriptedModelServer) -> None:
    """A script is the user's text, and this server runs in the model gateway's event loop, which
    serves every model call of its node: a NaN handed to that loop's timers (a NaN ``stream_ms``
    reaches ``asyncio.sleep``) breaks the order of all of them, and other calls' timers stop firing."""
    for key in ("delay_ms", "stream_ms"):
        for value in ("NaN", "Infinity", "-1", "600001", "true"):
            content = f'Do the thing.\n#!script\n[{{"say": "x", "{key}": {value}}}]'
            with pytest.raises(litellm.BadRequestError,
                               match=f"'{key}' must be a number of milliseconds from 0 to 600,000"):
                await complete(server, [{"role": "user", "content": content}], stream=True)
    # The loop still keeps time: a delayed reply comes, and after its delay.
    started = time.monotonic()
    response = await complete(server, [{"role": "user", "content": scripted([{"say": "on time", "delay_ms": 100}])}])
    assert response.choices[0].message.content == "on time"
    assert time.monotonic() - started >= 0.1


async def test_step_counts_assistant_messages_after_the_last_real_input(server: ScriptedModelServer) -> None:
    old_turn = [
        {"role": "user", "content": scripted([{"say": "old answer"}], task="Earlier task.")},
        {"role": "assistant", "content": "old answer"},
    ]
    script = [
        {"call": [{"name": "run_command", "args": {"command": "true"}}]},
        {"say": "second step, saw ${0.exit_code}"},
    ]
    messages = [*old_turn, {"role": "user", "content": scripted(script)}]
    first = await complete(server, messages)
    assert calls_of(first) == [("run_command", {"command": "true"})], "earlier Turns do not count"

    messages = answered(messages, first, [{"exit_code": 0}])
    messages.append({"role": "user", "content": '<canopy:message from="sibling">hello</canopy:message>'})
    messages.append({"role": "user", "content": "<canopy:steer>hurry up</canopy:steer>"})
    second = await complete(server, messages)
    assert second.choices[0].message.content == "second step, saw 0"


async def test_demo_root_fans_out_waits_and_summarises(server: ScriptedModelServer) -> None:
    task = "Plan the opening of a small tea shop in Lisbon next spring."
    messages = [{"role": "system", "content": ROOT_SYSTEM}, {"role": "user", "content": task}]
    plan = await complete(server, messages)
    creates = calls_of(plan)
    assert 2 <= len(creates) <= 3
    assert all(name == "create_session" for name, _ in creates)
    assert len({args["name"] for _, args in creates}) == len(creates)
    assert all(task in args["description"] for _, args in creates)

    created = [
        {"session_id": f"s-{i}", "name": args["name"], "input_id": f"in-{i}", "turn_id": f"t-{i}"}
        for i, (_, args) in enumerate(creates)
    ]
    messages = answered(messages, plan, created)
    wait = await complete(server, messages)
    assert calls_of(wait) == [("wait_inputs", {"input_ids": [c["input_id"] for c in created]})]

    outputs = [f"findings number {i} about tea" for i in range(len(created))]
    waited = {
        "results": [
            {"session_id": c["session_id"], "input_id": c["input_id"], "status": "completed", "output": out}
            for c, out in zip(created, outputs, strict=True)
        ],
        "timed_out": False,
    }
    summary = await complete(server, answered(messages, wait, [waited]))
    text = summary.choices[0].message.content
    assert summary.choices[0].finish_reason == "stop"
    for child, output in zip(created, outputs, strict=True):
        assert output in text and child["name"] in text


async def test_demo_root_reports_failed_children(server: ScriptedModelServer) -> None:
    messages = [{"role": "system", "content": ROOT_SYSTEM}, {"role": "user", "content": "Write a haiku."}]
    plan = await complete(server, messages)
    results: list[Any] = [{"error": "max_depth reached: cannot create a child here"}]
    results += [{"session_id": "s-1", "name": "draft", "input_id": "in-1"}] * (len(calls_of(plan)) - 1)
    reply = await complete(server, answered(messages, plan, results))
    assert not reply.choices[0].message.tool_calls
    assert "max_depth reached" in reply.choices[0].message.content


async def test_demo_child_answers_its_task(server: ScriptedModelServer) -> None:
    task = "Research the best tea suppliers in Portugal."
    messages = [{"role": "system", "content": CHILD_SYSTEM}, {"role": "user", "content": task}]
    response = await complete(server, messages)
    assert response.choices[0].finish_reason == "stop"
    assert task in response.choices[0].message.content
    again = await complete(server, messages)
    assert again.choices[0].message.content == response.choices[0].message.content


async def test_request_log_has_one_line_per_request(server: ScriptedModelServer) -> None:
    log_path = server.log_path
    assert log_path is not None
    before = log_path.read_text().splitlines() if log_path.exists() else []
    messages = [{"role": "user", "content": scripted([{"say": "logged"}], task="Log me.")}]
    await complete(server, messages)
    async for _chunk in await complete(server, messages, tools=None, stream=True):
        pass

    lines = log_path.read_text().splitlines()
    assert len(lines) == len(before) + 2
    with_tools, without_tools = (json.loads(line) for line in lines[-2:])
    assert with_tools["messages"] == messages and with_tools["model"] == "scripted"
    assert [t["function"]["name"] for t in with_tools["tools"]] == list(TOOL_NAMES)
    assert without_tools["tools"] is None
    assert (with_tools["stream"], without_tools["stream"]) == (False, True)
    assert isinstance(with_tools["ts"], float)
    # Every conversation the scripted model reads is in it: its user's only.
    assert log_path.stat().st_mode & 0o777 == 0o600


def test_the_scripted_models_requests_are_logged_only_when_asked(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The default model logged every tenant's whole conversation at each call, to a file others
    # could read, never rotated (a history sent again at each call: quadratic growth).
    monkeypatch.delenv("CANOPY_SCRIPTED_REQUEST_LOG", raising=False)  # the runtime tests' environment sets it
    assert gateway_options(Settings(data_dir=tmp_path))["log_path"] is None
    asked = Settings(data_dir=tmp_path, scripted_request_log=True)
    assert gateway_options(asked)["log_path"] == str(scripted_log_path(asked))


async def test_streaming_returns_the_same_reply(server: ScriptedModelServer) -> None:
    for script in ([{"say": "a streamed final answer, word by word"}],
                   [{"call": [{"name": "send_message", "args": {"target": "s-1", "text": "hi"}}]}]):
        messages = [{"role": "user", "content": scripted(script)}]
        plain = (await complete(server, messages)).choices[0].message
        chunks = [chunk async for chunk in await complete(server, messages, stream=True)]
        streamed = litellm.stream_chunk_builder(chunks, messages=messages).choices[0].message
        assert streamed.content == plain.content
        assert [(c.id, c.function.name, c.function.arguments) for c in streamed.tool_calls or []] == [
            (c.id, c.function.name, c.function.arguments) for c in plain.tool_calls or []
        ]


async def test_health_and_models(server: ScriptedModelServer) -> None:
    async with httpx.AsyncClient() as client:
        health = await client.get(server.base_url.removesuffix("/v1") + "/healthz")
        models = await client.get(server.base_url + "/models")
    assert health.json() == {"status": "ok"}
    assert [m["id"] for m in models.json()["data"]] == ["scripted"]


async def test_sse_wire_format_ends_with_done(server: ScriptedModelServer) -> None:
    body = {"model": "scripted", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": scripted([{"say": "hi there"}])}]}
    async with httpx.AsyncClient() as client:
        response = await client.post(server.base_url + "/chat/completions", json=body)
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "hi there"
    assert chunks[-1]["usage"]["completion_tokens"] > 0
