"""ModelGateway against the real scripted endpoint through real litellm, as an object and as a Ray actor."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import ray
import yaml

from actors import model_gateway
from actors.model_gateway import INVALID_ARGUMENTS, ModelError, ModelGateway
from actors.scripted import builders
from actors.scripted.server import ScriptedModelServer, serve_scripted_model
from tests.actors.replay_server import ReplayServer, calls, fail, flood, say
from tests.conftest import AGENT_API_BASES

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("create_session", "wait_inputs", "run_command")
]
CANCEL_BOUND_SECONDS = 5.0
_USAGE_REPORTED = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def scripted(steps: list[dict[str, Any]], task: str = "Do the thing.") -> list[dict[str, Any]]:
    return [{"role": "user", "content": builders.script(*steps, task=task)}]


async def _ignore_delta(delta: str) -> None:
    """A streamed call's text sink that keeps nothing: the call is streamed, its deltas unread."""


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
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, log_path=str(log_path), timeout_seconds=30, retries=2)
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
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=5, retries=1)
    started = time.monotonic()
    with pytest.raises(ModelError, match="after 2 attempts") as failed:
        await gw.complete(model="openai/scripted", messages=scripted([{"say": "x"}]), tools=None,
                          api_base=AGENT_API_BASES[1])  # nothing listens there: connections are refused
    assert time.monotonic() - started >= 0.5, "backs off before retrying"
    assert [a["model"] for a in failed.value.attempts] == [f"openai/scripted @ {AGENT_API_BASES[1]}"] * 2
    assert all("Connection" in a["error"] for a in failed.value.attempts)


async def test_other_models_pass_through_with_the_named_key_and_base(
    tmp_path: Path, replay: ReplayServer
) -> None:
    (tmp_path / "REPLAY_TEAM_KEY").write_text("sk-team\n")
    gw = ModelGateway(timeout_seconds=30, retries=0, secrets_dir=str(tmp_path), agent_api_bases=(replay.base_url,))
    replay.script("direct", say("direct"))
    result = await gw.complete(model="openai/direct", messages=scripted([{"say": "ignored"}]), tools=None,
                               api_key_ref="REPLAY_TEAM_KEY", api_base=replay.base_url)
    assert result["message"]["content"] == "direct" and result["model"] == f"openai/direct @ {replay.base_url}"
    assert result["cost_usd"] is None, "an unpriced model has no cost rather than failing, nor a cost of 0"
    assert replay.requests_for("direct")[0].authorization == "Bearer sk-team"


async def test_a_priced_model_is_charged_its_tokens_streamed_or_not(replay: ReplayServer) -> None:
    import litellm  # the price map, read independently of the gateway

    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0)
    replay.script("gpt-4o-mini", say("plain"), say("streamed"))
    prompt, completion = litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=11, completion_tokens=7)
    deltas: list[str] = []

    async def on_delta(delta: str) -> None:
        deltas.append(delta)

    for streamed in (None, on_delta):
        result = await gw.complete(model="openai/gpt-4o-mini", messages=scripted([{"say": "x"}]), tools=None,
                                   api_base=replay.base_url, on_delta=streamed)
        assert result["usage"] == {"prompt_tokens": 11, "completion_tokens": 7}
        assert result["cost_usd"] == pytest.approx(prompt + completion) and result["cost_usd"] > 0
    assert deltas == ["streamed"]


async def test_arguments_nested_past_the_parsers_depth_are_never_an_internal_error(replay: ReplayServer) -> None:
    """A provider's tool call nested deeper than Python's JSON parser recurses: streamed, the gateway
    reads the reply (the call's arguments are marked as not a JSON object, for the model to be told);
    whole, litellm cannot read it, and the call fails with a ModelError after its retries."""
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=1)
    deep = '{"agent_id": ' + "[" * 50_000 + "]" * 50_000 + "}"
    replay.script("deep", then=calls(("list_agents", deep)))

    streamed = await gw.complete(model="openai/deep", messages=scripted([{"say": "x"}]), tools=None,
                                 api_base=replay.base_url, on_delta=_ignore_delta)
    [call] = streamed["message"]["tool_calls"]
    assert (call["name"], call["arguments"]) == ("list_agents", {INVALID_ARGUMENTS: deep})
    with pytest.raises(ModelError, match="after 2 attempts"):
        await gw.complete(model="openai/deep", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url)
    assert len(replay.requests_for("deep")) == 3


async def test_text_postgresql_cannot_store_never_leaves_the_gateway(replay: ReplayServer) -> None:
    """PostgreSQL cannot store U+0000 or a lone surrogate: a reply's text and a provider's error get
    U+FFFD instead, a tool name or call id "_" (as for any character a provider would not take back
    in a request's history), and arguments holding one (escaped in the JSON, or as a raw character
    the JSON parser refuses) are marked invalid, streamed or whole."""
    escaped = json.dumps({"path": "a\u0000b"})
    surrogate = json.dumps({"path": "a\udc00b"})
    raw = '{"path": "a\u0000b"}'
    replay.script("nul", then={**calls(("list\u0000agents", escaped, "call\u00001"), ("write_file", raw),
                                       ("read_file", surrogate)),
                               "text": "x\u0000y\ud800"})

    for streamed in (_ignore_delta, None):
        reply = await ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0).complete(
            model="openai/nul", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url,
            on_delta=streamed)
        message = reply["message"]
        assert message["content"] == "x\ufffdy\ufffd"
        index = 1 if streamed else 2
        assert message["tool_calls"] == [
            {"id": "call_1", "name": "invalid_name_list_agents", "arguments": {INVALID_ARGUMENTS: escaped}},
            {"id": f"call_{index}_1", "name": "write_file", "arguments": {INVALID_ARGUMENTS: '{"path": "a\ufffdb"}'}},
            {"id": f"call_{index}_2", "name": "read_file", "arguments": {INVALID_ARGUMENTS: surrogate}}]
    replay.script("nul-error", then=fail(400, "bad\u0000request"))
    with pytest.raises(ModelError) as failed:
        await ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0).complete(
            model="openai/nul-error", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url)
    assert "bad\ufffdrequest" in str(failed.value), failed.value
    assert [attempt["error"] for attempt in failed.value.attempts] == [str(failed.value)]


async def test_arguments_jsonb_cannot_store_are_marked_invalid(replay: ReplayServer) -> None:
    """Python's JSON parser takes NaN, Infinity and numbers past a double (1e999 is inf): jsonb
    refuses them, so a reply carrying one could never be committed. Such arguments are marked as
    not a JSON object, for the model to be told, streamed or whole."""
    raws = ['{"path": "a", "limit": NaN}', '{"path": "a", "limit": -Infinity}', '{"path": "a", "x": [1e999]}']
    replay.script("nan", then=calls(*(("read_file", raw) for raw in raws)))

    for streamed in (_ignore_delta, None):
        reply = await ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0).complete(
            model="openai/nan", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url,
            on_delta=streamed)
        assert [call["arguments"] for call in reply["message"]["tool_calls"]] == [
            {INVALID_ARGUMENTS: raw} for raw in raws]


@pytest.mark.parametrize("usage", [{"prompt_tokens": -1_000_000_000, "completion_tokens": 5},
                                   {"prompt_tokens": 10, "completion_tokens": 2**70}])
async def test_usage_a_provider_cannot_have_spent_is_replaced_by_the_estimate(replay: ReplayServer,
                                                                             usage: dict[str, object]) -> None:
    """Negative token counts would lower a tree's usage past its budgets, and figures past bigint
    would fail the reply's commit: a reply whose usage is not a plausible count gets litellm's
    estimate, as one without usage does, and is priced from it."""
    messages = [{"role": "user", "content": "tell me something " * 50}]
    replay.script("gpt-4o-mini", then={**say("an answer " * 20), "usage": usage})

    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0)
    counted = await gw.count_tokens(model="openai/gpt-4o-mini", messages=messages)
    for streamed in (None, _ignore_delta):
        reply = await gw.complete(model="openai/gpt-4o-mini", messages=messages, tools=None,
                                  api_base=replay.base_url, on_delta=streamed)
        assert reply["usage"]["prompt_tokens"] == counted
        assert 10 < reply["usage"]["completion_tokens"] < 1000
        assert reply["cost_usd"] > 0


async def test_a_reply_without_usage_is_counted_by_litellms_estimate(replay: ReplayServer) -> None:
    """A provider that reports no usage (some OpenAI-compatible servers) gets litellm's estimate,
    whole or streamed, and a priced model its price: budgets count what it spends."""
    import litellm  # the price map, read independently of the gateway

    text = "a fairly long answer, " * 40
    replay.script("gpt-4o-mini", then={**say(text), "usage": None})
    messages = [{"role": "user", "content": "tell me something " * 50}]

    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0)
    whole, streamed = [await gw.complete(model="openai/gpt-4o-mini", messages=messages, tools=None,
                                         api_base=replay.base_url, on_delta=d) for d in (None, _ignore_delta)]
    counted = await gw.count_tokens(model="openai/gpt-4o-mini", messages=messages)
    assert whole["usage"]["prompt_tokens"] == counted > 100
    assert whole["usage"]["completion_tokens"] > 100
    assert whole["usage"] == streamed["usage"]
    price = sum(litellm.cost_per_token(model="gpt-4o-mini", **whole["usage"]))
    assert whole["cost_usd"] == pytest.approx(price) and price > 0


async def test_a_reply_without_choices_is_a_model_error(replay: ReplayServer) -> None:
    """A provider that answers 200 with no choices (as a content filter may) fails the call clearly."""
    replay.script("no-choices", then={"body": {"id": "x", "object": "chat.completion", "created": 1,
                                               "model": "no-choices", "choices": []}})
    with pytest.raises(ModelError, match="no choices"):
        await ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0).complete(
            model="openai/no-choices", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url)


@pytest.mark.parametrize("streamed", [None, _ignore_delta], ids=["whole", "streamed"])
async def test_a_reply_sent_slowly_past_the_timeout_fails_the_call(replay: ReplayServer, streamed: Any) -> None:
    """litellm's timeout bounds each read of a reply: a provider that sends a piece more often than
    that (a reply drip-fed, a stream that never ends) held the call, and its Run's slot, forever.
    A call ends within its timeout for each attempt it may make."""
    replay.script("drip", then={**say("x" * 30), "drip": 0.3})
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=1, retries=1)
    with pytest.raises(ModelError, match="took longer than 2 s"):
        await gw.complete(model="openai/drip", messages=scripted([{"say": "x"}]), tools=None,
                          api_base=replay.base_url, on_delta=streamed)


async def test_a_stream_cut_off_midway_is_asked_again(replay: ReplayServer) -> None:
    """The Router retries a request that fails, but a stream's chunks are read after it returned: a
    stream cut off midway failed the call (a watched tree's calls are streamed, so a human watching
    turned a provider's hiccup into a failed Turn). It is asked again, as a whole reply."""
    replay.script("cut", {**say("never finished"), "break_after": 1}, say("whole"))
    reply = await ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=2).complete(
        model="openai/cut", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url,
        on_delta=_ignore_delta)
    assert reply["message"]["content"] == "whole"
    assert [r.body.get("stream", False) for r in replay.requests_for("cut")] == [True, False]
    [attempt] = reply["failed_attempts"]
    assert attempt["model"] == f"openai/cut @ {replay.base_url}"


async def test_a_cost_a_provider_cannot_have_charged_is_priced_from_the_tokens(replay: ReplayServer) -> None:
    """An OpenAI-compatible provider reports its charge in ``usage.cost``: 1.5e308 overflowed the
    sum of the tree's next reply in PostgreSQL, failing every later reply of the lineage."""
    import litellm  # the price map, read independently of the gateway

    replay.script("gpt-4o-mini", then={**say("priced"), "usage": {**_USAGE_REPORTED, "cost": 1.5e308}})
    price = sum(litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=11, completion_tokens=7))
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0)
    for streamed in (None, _ignore_delta):
        reply = await gw.complete(model="openai/gpt-4o-mini", messages=scripted([{"say": "x"}]), tools=None,
                                  api_base=replay.base_url, on_delta=streamed)
        assert reply["cost_usd"] == pytest.approx(price) and price > 0


async def test_a_tool_call_of_another_type_is_answered_as_unknown(replay: ReplayServer) -> None:
    """A ``custom`` tool call (no ``function``) made the reply unreadable: the Turn failed with an
    AttributeError, and the reply the provider billed was charged to nobody."""
    replay.script("custom", then={"body": {
        "id": "x", "object": "chat.completion", "created": 1, "model": "custom", "usage": _USAGE_REPORTED,
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "run_command", "input": "ls"}}]}}]}})
    reply = await ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0).complete(
        model="openai/custom", messages=scripted([{"say": "x"}]), tools=None, api_base=replay.base_url)
    [call] = reply["message"]["tool_calls"]
    assert call["id"] == "c1" and call["name"].startswith("invalid_name_") and call["name"] != "run_command"
    assert reply["usage"] == {"prompt_tokens": 11, "completion_tokens": 7}


async def test_an_agents_api_base_never_gets_a_provider_key_it_did_not_name(
    monkeypatch: pytest.MonkeyPatch, replay: ReplayServer
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-only")
    gw = ModelGateway(timeout_seconds=30, retries=0, provider_env=("OPENAI_API_KEY",),
                      agent_api_bases=(replay.base_url,))
    replay.script("elsewhere", say("hello"))
    await gw.complete(model="openai/elsewhere", messages=scripted([{"say": "x"}]), tools=None,
                      api_base=replay.base_url)
    assert "sk-operator-only" not in (replay.requests_for("elsewhere")[0].authorization or "")
    # A name outside the provider variables is not a key an agent may use, whatever the environment holds.
    monkeypatch.setenv("REPLAY_NOT_A_PROVIDER_KEY", "sk-secret")
    assert "REPLAY_NOT_A_PROVIDER_KEY" in (await gw.check_model("openai/elsewhere", replay.base_url,
                                                                 "REPLAY_NOT_A_PROVIDER_KEY") or "")
    with pytest.raises(ModelError, match="REPLAY_NOT_A_PROVIDER_KEY"):
        await gw.complete(model="openai/elsewhere", messages=scripted([{"say": "x"}]), tools=None,
                          api_base=replay.base_url, api_key_ref="REPLAY_NOT_A_PROVIDER_KEY")
    assert len(replay.requests_for("elsewhere")) == 1


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_reply_longer_than_the_limit_fails_the_call(replay: ReplayServer, streamed: bool) -> None:
    """A model's reply is untrusted: 20 MB of text or of a tool call's arguments from an endpoint that
    answers so was kept whole, stored and sent back with every later call of the session. Past the
    limit the call fails, saying so; a stream is cut off as it passes it."""
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0, max_reply_chars=50_000)
    on_delta = _ignore_delta if streamed else None
    replay.script("flood-text", say("y" * 60_000))
    replay.script("flood-args", calls(("list_sessions", json.dumps({"note": "z" * 60_000}))))
    replay.script("flood-calls", calls(*[("list_sessions", "{}", f"call-{n:05d}-" + "i" * 50) for n in range(1000)]))
    for model in ("flood-text", "flood-args", "flood-calls"):
        with pytest.raises(ModelError, match="more than the 50,000 characters a reply may hold") as refused:
            await gw.complete(model=f"openai/{model}", messages=scripted([{"say": "x"}]), tools=None,
                              api_base=replay.base_url, on_delta=on_delta)
        charged = refused.value.charged  # billed, so accounted as the reply would have been
        assert charged is not None and charged["model"] == f"openai/{model} @ {replay.base_url}", charged
        assert charged["usage"]["completion_tokens"] > 0, charged
    replay.script("fits", say("y" * 49_000))
    reply = await gw.complete(model="openai/fits", messages=scripted([{"say": "x"}]), tools=None,
                              api_base=replay.base_url, on_delta=on_delta)
    assert reply["message"]["content"] == "y" * 49_000


@pytest.mark.parametrize(("streamed", "how"), [
    (False, {}), (True, {}),
    # What the endpoint says of its body decides nothing: compressed, it is counted as it inflates
    # (58 KB of gzip were read as 60 MB); labelled an event stream, a whole reply is not read by line.
    (False, {"gzip": True}), (True, {"gzip": True}), (False, {"event_stream": True, "line_every": 1_000_000}),
], ids=["whole", "streamed", "whole-gzip", "streamed-gzip", "whole-labelled-a-stream"])
async def test_a_body_far_past_the_limit_is_not_read_whole(replay: ReplayServer, streamed: bool,
                                                           how: dict[str, Any]) -> None:
    """An endpoint's body is untrusted too: 100 MB that never ends its first line was read whole
    (litellm reads a whole reply's body, and a stream's line, before anything counts characters),
    ~5 × that in the gateway's memory, which every user's calls on its node share. It stops being
    read a few times past what a reply of the limit's characters can take."""
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=60, retries=2, max_reply_chars=50_000)
    model = f"flood-bytes-{'streamed' if streamed else 'whole'}-{uuid.uuid4().hex[:8]}"
    replay.script(model, flood(100_000_000, streamed=streamed, **how))
    with pytest.raises(ModelError, match="CANOPY_MAX_REPLY_CHARS"):
        await gw.complete(model=f"openai/{model}", messages=scripted([{"say": "x"}]), tools=None,
                          api_base=replay.base_url, on_delta=_ignore_delta if streamed else None)
    await gw.close()
    assert replay.flood_sent[model] < 20_000_000, f"{replay.flood_sent[model]:,} bytes were read"
    assert len(replay.requests_for(model)) == 1, "a reply too large is not asked for again"


async def test_a_compressed_reply_within_the_limit_is_read(replay: ReplayServer) -> None:
    # The gateway asks for no compression and inflates, in bounded steps, a body that comes gzipped all the same.
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0, max_reply_chars=50_000)
    replay.script("gzipped", {**say("z" * 40_000), "gzip": True})
    reply = await gw.complete(model="openai/gzipped", messages=scripted([{"say": "x"}]), tools=None,
                              api_base=replay.base_url)
    assert reply["message"]["content"] == "z" * 40_000


async def test_with_no_endpoints_listed_no_api_base_is_called(
    monkeypatch: pytest.MonkeyPatch, replay: ReplayServer
) -> None:
    """Whoever may create agents names their api_base, and the gateway calls it from inside the
    cluster: with no endpoint listed by the operator, a URL of that user's choosing (the Ray
    dashboard, a metadata service, any loopback port) would be asked and its answer shown back in
    the Turn's error. Nothing is called, with a key or without."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-only")
    gw = ModelGateway(timeout_seconds=30, retries=0, provider_env=("OPENAI_API_KEY",))
    replay.script("unlisted", say("never"))
    before = len(replay.received)
    for key in ("OPENAI_API_KEY", None):
        refused = await gw.check_model("openai/unlisted", replay.base_url, key) or ""
        assert "CANOPY_AGENT_API_BASES" in refused and replay.base_url in refused, refused
        with pytest.raises(ModelError, match="CANOPY_AGENT_API_BASES"):
            await gw.complete(model="openai/unlisted", messages=scripted([{"say": "x"}]), tools=None,
                              api_base=replay.base_url, api_key_ref=key)
    assert len(replay.received) == before


async def test_an_endpoint_listed_with_its_keys_gets_no_other_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, replay: ReplayServer
) -> None:
    """Listed as a plain URL, an endpoint may be sent any key an agent names: the operator's OpenAI key
    to the team's GPU box, or to a box a tenant runs. Listed with its keys, it gets only those."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-only")
    (tmp_path / "REPLAY_TEAM_KEY").write_text("sk-team\n")
    gw = ModelGateway(timeout_seconds=30, retries=0, provider_env=("OPENAI_API_KEY",), secrets_dir=str(tmp_path),
                      agent_api_bases={replay.base_url: ["REPLAY_TEAM_KEY"]})
    replay.script("paired", say("with the team key"), say("with none"))
    before = len(replay.received)
    refused = await gw.check_model("openai/paired", replay.base_url, "OPENAI_API_KEY") or ""
    assert "OPENAI_API_KEY" in refused and "REPLAY_TEAM_KEY" in refused and "CANOPY_AGENT_API_BASES" in refused
    with pytest.raises(ModelError, match="CANOPY_AGENT_API_BASES"):
        await gw.complete(model="openai/paired", messages=scripted([{"say": "x"}]), tools=None,
                          api_base=replay.base_url, api_key_ref="OPENAI_API_KEY")
    assert len(replay.received) == before
    for key, says in (("REPLAY_TEAM_KEY", "with the team key"), (None, "with none")):
        assert await gw.check_model("openai/paired", replay.base_url, key) is None
        reply = await gw.complete(model="openai/paired", messages=scripted([{"say": "x"}]), tools=None,
                                  api_base=replay.base_url, api_key_ref=key)
        assert reply["message"]["content"] == says
    assert [r.authorization for r in replay.requests_for("paired")] == ["Bearer sk-team", "Bearer canopy-no-key"]


async def test_a_key_goes_only_with_a_listed_api_base_and_no_call_goes_to_a_local_default(
    monkeypatch: pytest.MonkeyPatch, replay: ReplayServer
) -> None:
    """Without an api_base a call goes where litellm's provider goes by default, and for some that is
    a server on the gateway's own machine (llamafile: 127.0.0.1:8080, ollama: localhost:11434,
    lemonade: localhost:8000, the API's own port): a sandbox command listening there would have been
    sent the operator's key an agent named, and any agent could have the gateway POST there and read
    the answer in its Turn's error. A key goes only with a listed api_base; a local server is reached
    as one, or where the operator's variable says."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-only")
    for variable in ("OLLAMA_API_BASE", "LLAMAFILE_API_BASE", "LEMONADE_API_BASE", "LANGFLOW_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    gw = ModelGateway(timeout_seconds=30, retries=0, provider_env=("OPENAI_API_KEY",),
                      agent_api_bases=AGENT_API_BASES)
    for model, key in (("llamafile/x", "OPENAI_API_KEY"), ("openai/gpt-4o-mini", "OPENAI_API_KEY"),
                       ("llamafile/x", None), ("ollama/llama3", None), ("ollama_chat/llama3", None),
                       ("lemonade/x", None), ("langflow/x", None)):
        refused = await gw.check_model(model, None, key) or ""
        assert "CANOPY_AGENT_API_BASES" in refused, (model, key, refused)
        with pytest.raises(ModelError, match="CANOPY_AGENT_API_BASES"):
            await gw.complete(model=model, messages=scripted([{"say": "x"}]), tools=None, api_key_ref=key)
    # A provider's own public endpoint, with its own key from the environment, is no agent's choice;
    # nor is the server the operator's variable names.
    assert await gw.check_model("openai/gpt-4o-mini", None, None) is None
    monkeypatch.setenv("LLAMAFILE_API_BASE", replay.base_url)
    replay.script("x", say("from the operator's server"))
    reply = await gw.complete(model="llamafile/x", messages=scripted([{"say": "x"}]), tools=None)
    assert reply["message"]["content"] == "from the operator's server"


async def test_a_model_string_holding_a_url_is_refused(replay: ReplayServer) -> None:
    """Some of litellm's providers take the endpoint from the model string itself (oobabooga,
    huggingface): a URL there would go round the endpoints the operator lists."""
    origin = replay.base_url.removesuffix("/v1")
    gw = ModelGateway(timeout_seconds=30, retries=0, agent_api_bases=("https://api.example.com/v1",))
    before = len(replay.received)
    for model in (f"oobabooga/{origin}", f"huggingface/{origin}/v1", f"oobabooga/HTTP://{origin[7:]}"):
        refused = await gw.check_model(model) or ""
        assert "api_base" in refused and "URL" in refused, (model, refused)
        with pytest.raises(ModelError, match="URL"):
            await gw.complete(model=model, messages=scripted([{"say": "x"}]), tools=None)
    assert len(replay.received) == before


async def test_an_api_base_that_climbs_out_of_its_entry_or_carries_a_query_is_refused(
    monkeypatch: pytest.MonkeyPatch, replay: ReplayServer
) -> None:
    """The HTTP client resolves dot segments before it sends (``/v1/../admin`` is ``/admin``), so a
    path compared as written would take the entry's key out from under its path; a query or a
    fragment would cut off the path litellm appends."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-only")
    origin = replay.base_url.removesuffix("/v1")
    gw = ModelGateway(timeout_seconds=30, retries=0, provider_env=("OPENAI_API_KEY",),
                      agent_api_bases=(f"{origin}/v1/models",))
    before = len(replay.received)
    for api_base in (f"{origin}/v1/models/..", f"{origin}/v1/models/%2E%2e", f"{origin}/v1/models/./..",
                     f"{origin}/v1/models?to=/v1/chat/completions", f"{origin}/v1/models#x"):
        refused = await gw.check_model("openai/climb", api_base, "OPENAI_API_KEY") or ""
        assert "CANOPY_AGENT_API_BASES" in refused, (api_base, refused)
        with pytest.raises(ModelError, match="CANOPY_AGENT_API_BASES"):
            await gw.complete(model="openai/climb", messages=scripted([{"say": "x"}]), tools=None,
                              api_base=api_base, api_key_ref="OPENAI_API_KEY")
    assert len(replay.received) == before


async def test_api_bases_outside_the_allowed_prefixes_are_refused(replay: ReplayServer) -> None:
    gw = ModelGateway(timeout_seconds=30, retries=0, agent_api_bases=(replay.base_url,))
    replay.script("allowed", say("fine"))
    assert await gw.check_model("openai/allowed", replay.base_url, None) is None
    assert "CANOPY_AGENT_API_BASES" in (await gw.check_model("openai/allowed", "http://10.0.0.1/v1", None) or "")
    with pytest.raises(ModelError, match="CANOPY_AGENT_API_BASES"):
        await gw.complete(model="openai/allowed", messages=scripted([{"say": "x"}]), tools=None,
                          api_base="http://10.0.0.1/v1")
    result = await gw.complete(model="openai/allowed", messages=scripted([{"say": "x"}]), tools=None,
                               api_base=replay.base_url)
    assert result["message"]["content"] == "fine"


async def test_an_allowed_api_base_is_matched_by_its_endpoint_not_as_a_text_prefix(replay: ReplayServer) -> None:
    """An allowed entry names a scheme, host, port and path: a URL that only starts with its text (a
    longer host, a longer port, credentials that make the entry the user part, a longer path segment)
    is elsewhere, and the operator's key must not go there."""
    origin = replay.base_url.removesuffix("/v1")
    port = origin.rsplit(":", 1)[1]
    gw = ModelGateway(timeout_seconds=30, retries=0,
                      agent_api_bases=(origin, "https://api.example.com/v1", "http://gpu-box"))
    replay.script("endpoint", say("fine"))
    elsewhere = [f"{origin}@localhost:{port}/v1",  # the entry as credentials: the host is localhost
                 f"{origin}0/v1", "https://api.example.com.evil.example/v1", "https://api.example.com/v10",
                 "https://api.example.com:444/v1", "http://api.example.com/v1", "http://gpu-box:22/v1",
                 "http://gpu-box.evil.example/v1", "http://gpu-box\\@evil.example/v1"]
    for api_base in elsewhere:
        assert "CANOPY_AGENT_API_BASES" in (await gw.check_model("openai/endpoint", api_base, None) or ""), api_base
    with pytest.raises(ModelError, match="CANOPY_AGENT_API_BASES"):
        await gw.complete(model="openai/endpoint", messages=scripted([{"say": "x"}]), tools=None,
                          api_base=f"{origin}@localhost:{port}/v1")
    assert replay.requests_for("endpoint") == []
    for api_base in [replay.base_url, f"{origin}/", "https://API.example.com/v1/", "https://api.example.com:443/v1/x",
                     "http://gpu-box:80/v1"]:
        assert "CANOPY_AGENT_API_BASES" not in (await gw.check_model("openai/endpoint", api_base, None) or ""), api_base


async def test_a_gateway_keeps_a_bounded_number_of_agents_endpoints(replay: ReplayServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each agent's own endpoint is a deployment of the gateway's Router, which every call of the node,
    of every scope, routes through, at a cost that grows with its deployments (~2.6 ms more per call at
    1,000 of them, ~10 ms more per added one at 5,000). Whoever may create agents names a model string
    per agent: the Router keeps ENDPOINTS_KEPT of them, the least recently used idle ones forgotten
    (and added again when called), never one a call is still using."""
    import litellm  # here: the gateway imports it on its first use, not at the tests' collection

    kept = 8  # of ENDPOINTS_KEPT's 256: a call to a new endpoint takes ~30 ms here
    monkeypatch.setattr(model_gateway, "ENDPOINTS_KEPT", kept)
    gw = ModelGateway(agent_api_bases=(replay.base_url,), timeout_seconds=30, retries=0)
    models = [f"kept-{n}" for n in range(kept + 8)]
    for model in ["held", *models]:
        replay.script(model, then=say(f"from {model}"))
    routes = gw._current_routes()
    priced_before = set(litellm.model_cost)  # litellm's price entries, one or two per deployment added

    def endpoints() -> set[str]:  # the provider models of the Router's deployments but its two routes
        return {d["litellm_params"]["model"] for d in routes.router.registry().all()} - {"*", "openai/*"}

    with routes.route("openai/held", replay.base_url, None):
        for model in models:
            reply = await gw.complete(model=f"openai/{model}", messages=scripted([{"say": "x"}]), tools=None,
                                      api_base=replay.base_url)
            assert reply["message"]["content"] == f"from {model}"
        # In use, the least recently used is kept; idle ones went in its place.
        assert endpoints() == {"openai/held", *(f"openai/{model}" for model in models[-kept + 1:])}
        # A forgotten endpoint leaves no price entry behind (the process's litellm would grow for ever).
        kept_models = {endpoint.model for endpoint in routes._endpoints.values()}
        assert set(litellm.model_cost) - priced_before == {*routes._endpoints, *kept_models}
    # A forgotten endpoint is added again, and its call counted under its own name.
    reply = await gw.complete(model="openai/kept-0", messages=scripted([{"say": "x"}]), tools=None,
                              api_base=replay.base_url)
    assert (reply["message"]["content"], reply["model"]) == ("from kept-0", f"openai/kept-0 @ {replay.base_url}")
    assert len(replay.requests_for("kept-0")) == 2


def _write(path: Path, config: dict[str, Any]) -> None:
    aside = path.with_name(path.name + ".writing")
    aside.write_text(yaml.safe_dump(config))
    aside.replace(path)


async def test_the_models_file_is_reloaded_and_its_rpm_limit_holds_calls_back(
    tmp_path: Path, replay: ReplayServer
) -> None:
    path = tmp_path / "models.yaml"
    _write(path, {"model_list": []})
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0, models_file=str(path))
    assert "'limited'" in (await gw.check_model("limited", None, None) or ""), "not a model before the file names it"
    assert await gw.check_model("canopy/scripted", None, None) is None

    deployment = {"model": "openai/limited", "api_base": replay.base_url, "api_key": "sk-file", "rpm": 1}
    _write(path, {"model_list": [{"model_name": "limited", "litellm_params": deployment}]})
    assert await gw.check_model("limited", None, None) is None
    replay.script("limited", say("one"), say("two"))
    # litellm counts a deployment's requests per clock minute: both calls must fall in one.
    second_of_minute = time.time() % 60
    if second_of_minute > 45:
        await asyncio.sleep(60.5 - second_of_minute)
    first = await gw.complete(model="limited", messages=scripted([{"say": "x"}]), tools=None)
    assert first["message"]["content"] == "one" and first["model"] == "limited"
    with pytest.raises(ModelError, match=r"(?i)rate limit"):
        await gw.complete(model="limited", messages=scripted([{"say": "x"}]), tools=None)
    assert len(replay.requests_for("limited")) == 1, "the limit held the call back before it reached the provider"


async def test_an_error_text_litellm_logs_cannot_forge_a_log_line(tmp_path: Path, replay: ReplayServer,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """litellm logs a failed fallback's error text (the provider's, or a tenant's endpoint's) through a
    handler of its own, outside Ray's JSON lines: its newlines made lines of their own, which read as
    Canopy's lifecycle lines to whoever greps the worker's log for a Turn's id."""
    import actors.gateway_actor  # noqa: F401 - the logging a gateway's process sets up

    forged = json.dumps({"name": "canopy.lifecycle", "event": "turn_ended", "turn_id": "forged-0000"})
    path = tmp_path / "models.yaml"
    deployments = [{"model_name": name, "litellm_params": {"model": f"openai/forge-{name}", "api_base": replay.base_url,
                                                           "api_key": "sk-file"}} for name in ("main", "backup")]
    _write(path, {"model_list": deployments, "router_settings": {"fallbacks": [{"main": ["backup"]}]}})
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0, models_file=str(path))
    for name in ("main", "backup"):
        replay.script(f"forge-{name}", fail(400, f"bad request\n{forged}\n" + "x" * 5000))
    capfd.readouterr()
    with pytest.raises(ModelError):
        await gw.complete(model="main", messages=scripted([{"say": "x"}]), tools=None)
    logged = capfd.readouterr().err
    assert "forged-0000" in logged, "litellm logged the fallback's error (else this test checks nothing)"
    lines = logged.splitlines()
    assert not [line for line in lines if line.startswith("{") and "forged-0000" in line], logged[-2000:]
    assert max(map(len, lines)) <= 2_000, "an error text is cut, not logged whole"


async def test_a_model_the_models_file_prices_is_charged_that_price(tmp_path: Path, replay: ReplayServer) -> None:
    """litellm has no price for a model it does not know (None: a cost budget cannot count it); the
    operator's models file can give one (the fix a budget stopped for it names)."""
    path = tmp_path / "models.yaml"
    unpriced = {"model": "openai/house-model", "api_base": replay.base_url, "api_key": "sk-file"}
    priced = {**unpriced, "input_cost_per_token": 0.001, "output_cost_per_token": 0.002}
    _write(path, {"model_list": [{"model_name": "house", "litellm_params": unpriced},
                                 {"model_name": "house-priced", "litellm_params": priced}]})
    gw = ModelGateway(timeout_seconds=30, retries=0, models_file=str(path))

    async def on_delta(delta: str) -> None:
        pass

    for streamed in (None, on_delta):  # a watched tree's calls are streamed: litellm priced those 0
        replay.script("house-model", say("one"), say("two"))
        first = await gw.complete(model="house", messages=scripted([{"say": "x"}]), tools=None, on_delta=streamed)
        second = await gw.complete(model="house-priced", messages=scripted([{"say": "x"}]), tools=None,
                                   on_delta=streamed)
        assert (first["usage"], second["usage"]) == ({"prompt_tokens": 11, "completion_tokens": 7},) * 2
        assert first["cost_usd"] is None
        assert second["cost_usd"] == pytest.approx(11 * 0.001 + 7 * 0.002), streamed


async def test_the_readmes_models_file_is_one_the_gateway_takes(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("**Routes, fallbacks, limits, retries**", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "models.yaml"
    path.write_text(example)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme")
    gw = ModelGateway(timeout_seconds=30, retries=0, models_file=str(path), provider_env=("OPENAI_API_KEY",))
    assert await gw.check_model("smart", None, None) is None and await gw.check_model("local", None, None) is None
    assert "ANTHROPIC_API_KEY" in (await gw.check_model("smart-backup", None, None) or "")


@pytest.mark.parametrize(("text", "says"), [
    ("model_list: [", "YAML"),
    ("model_list: []\nlitellm_settings: {}\n", "litellm_settings"),
    ("model_list: [{model_name: x}]\n", "litellm_params"),
    ("router_settings: {no_such_setting: 1}\n", "no_such_setting"),
    # A NaN timeout reached the gateway loop's timers (every call's deadline on the node); a negative
    # one, or negative retries, cut every call off at once.
    *((f"router_settings: {{timeout: {value}}}\n", "router_settings.timeout must be a number of seconds above 0, "
       "at most 31,622,400") for value in (".nan", ".inf", "-1", "0", "1.0e+400", "'30'")),
    *((f"router_settings: {{num_retries: {value}}}\n", "router_settings.num_retries must be a whole number from 0 "
       "to 100") for value in ("-3", "true", "2.5", "101")),
    # The other timers of a call, there and in a deployment of its own (litellm hands them to the loop).
    ("router_settings: {cooldown_time: .nan}\n", "router_settings.cooldown_time must be a number of seconds from 0 to"),
    ("router_settings: {retry_after: -1}\n", "router_settings.retry_after must be a number of seconds from 0 to"),
    ("router_settings: {stream_timeout: 0}\n", "router_settings.stream_timeout must be a number of seconds above 0"),
    *((f"model_list: [{{model_name: m, litellm_params: {{model: openai/m}}}}, "
       f"{{model_name: m, litellm_params: {{model: openai/m, {key}: {value}}}}}]\n",
       f"model_list[1].litellm_params.{key} must be a {says}")
      for key, value, says in [("timeout", ".nan", "number of seconds above 0"),
                               ("stream_timeout", "-.inf", "number of seconds above 0"),
                               ("timeout", "os.environ/CANOPY_TEST_UNSET_TIMEOUT", "number of seconds above 0"),
                               ("request_timeout", "'soon'", "number of seconds above 0"),
                               ("max_retries", "1000", "whole number from 0 to 100")]),
    # litellm sets these on every call that does not name its own.
    ("router_settings: {default_litellm_params: {timeout: .nan}}\n",
     "router_settings.default_litellm_params.timeout must be a number of seconds above 0"),
])
async def test_a_broken_models_file_is_a_clear_error(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    gw = ModelGateway(agent_api_bases=AGENT_API_BASES, timeout_seconds=30, retries=0, models_file=str(path))
    problem = await gw.check_model("canopy/scripted", None, None)
    assert problem is not None and str(path) in problem and says in problem, problem
    with pytest.raises(ModelError, match=re.escape(says)):
        await gw.complete(model="canopy/scripted", messages=scripted([{"say": "x"}]), tools=None)


async def test_a_deployments_numbers_may_be_text_as_litellm_takes_them(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANOPY_TEST_TIMEOUT", "45")
    path = tmp_path / "models.yaml"
    path.write_text("model_list: [{model_name: m, litellm_params: {model: openai/m, api_key: k, timeout: '30', "
                    "stream_timeout: os.environ/CANOPY_TEST_TIMEOUT, max_retries: '2'}}]\n")
    gw = ModelGateway(timeout_seconds=30, retries=0, models_file=str(path))
    assert await gw.check_model("m", None, None) is None


async def test_a_models_files_null_timeout_and_retries_are_canopys(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("router_settings: {timeout: null, num_retries: null}\n")
    gw = ModelGateway(timeout_seconds=30, retries=0, models_file=str(path))
    assert await gw.check_model("canopy/scripted", None, None) is None
    reply = await gw.complete(model="canopy/scripted", messages=scripted([{"say": "fine"}]), tools=None)
    assert reply["message"]["content"] == "fine"
    await gw.close()


async def test_cancellation_aborts_the_http_call(own_server: ScriptedModelServer) -> None:
    gateway = ModelGateway(agent_api_bases=(own_server.base_url,), timeout_seconds=30, retries=2)
    call = asyncio.create_task(gateway.complete(
        model="openai/scripted", messages=scripted([{"say": "x", "delay_ms": 10000}]), tools=None,
        api_base=own_server.base_url,
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
    await gateway.close()


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


async def test_a_gateway_whose_scripted_port_is_taken_serves_on_a_free_one(log_path: Path) -> None:
    """Nodes of one machine share its ports: a second gateway configured with the same scripted port
    still answers (on a port of its own), and the first one keeps its."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        holder.listen(1)
        gateway = ModelGateway(scripted_port=taken, log_path=str(log_path), timeout_seconds=30, retries=0)
        try:
            reply = await gateway.complete(model="canopy/scripted", messages=scripted([builders.say("on my own port")]),
                                           tools=None)
            url = await gateway.scripted_base_url()
        finally:
            await gateway.close()
    assert reply["message"]["content"] == "on my own port"
    assert url.startswith("http://127.0.0.1:") and f":{taken}/" not in url, url
