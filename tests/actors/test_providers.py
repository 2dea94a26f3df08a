"""Real providers end to end: the whole runtime drives agents whose model is ``openai/<name>`` on
an OpenAI-compatible server of the test's own (tests/actors/replay_server.py) through real
litellm, its Router and real HTTP. The models file (``CANOPY_MODELS_FILE``, set by
tests/conftest.py's runtime fixture) is rewritten here: the gateway reloads it when it changes."""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
import yaml

from actors.runtime import Runtime
from actors.scripted import say as scripted_say
from actors.scripted import script
from api import views
from api.errors import status_of
from persistence.errors import Conflict, InvalidArgument
from persistence.records import Row, Scope
from tests.actors.helpers import eventually, rows
from tests.actors.replay_server import ReplayServer, calls, fail, say
from tests.conftest import RUNTIME_ENV

MARKER = RUNTIME_ENV["OPENAI_API_KEY"]


def _write_atomically(path: Path, text: str) -> None:
    aside = path.with_name(f".{path.name}.writing")
    aside.write_text(text)
    aside.replace(path)


@pytest.fixture(scope="module")
async def models_file(runtime: Runtime, replay: ReplayServer) -> AsyncIterator[Path]:
    """Two models of the file: a primary whose server always fails, and its fallback."""
    path = runtime.settings.models_file
    assert path is not None and path.exists(), "tests/conftest.py's runtime fixture sets CANOPY_MODELS_FILE"
    before = path.read_text()
    deployment = {"api_base": replay.base_url, "api_key": "os.environ/OPENAI_API_KEY"}
    _write_atomically(path, yaml.safe_dump({
        "model_list": [
            {"model_name": "flaky-primary", "litellm_params": {"model": "openai/primary-c", **deployment}},
            {"model_name": "steady-backup", "litellm_params": {"model": "openai/backup-c", **deployment}},
        ],
        "router_settings": {"fallbacks": [{"flaky-primary": ["steady-backup"]}]},
    }))
    yield path
    _write_atomically(path, before)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _agent(runtime: Runtime, scope: Scope, model: str, **fields: Any) -> str:
    agent_id = _name("agent")
    await runtime.create_agent(scope, {"agent_id": agent_id, "name": agent_id, "model": model, **fields})
    return agent_id


async def _model_calls(runtime: Runtime, session_id: uuid.UUID, count: int) -> list[Row]:
    """The session's ``count`` model call records (the gateway writes them shortly after each reply)."""
    async def recorded() -> list[Row]:
        found = await rows(runtime.db, """
            SELECT c.model, c.error, c.prompt_tokens, c.completion_tokens FROM model_calls c
            JOIN runs r ON r.run_id = c.run_id WHERE r.session_id = %s ORDER BY c.created_at, c.id""", session_id)
        return found if len(found) >= count else []

    return await eventually(recorded, timeout=10)


def _secrets_dir(runtime: Runtime) -> Path:
    return runtime.settings.data_dir.expanduser().resolve() / "secrets"


async def test_a_real_provider_runs_a_roots_tool_calls_with_the_named_key(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    model = _name("replay-a")
    kid = await _agent(runtime, scope, "canopy/scripted")
    lead = await _agent(runtime, scope, f"openai/{model}", api_base=replay.base_url, api_key_ref="OPENAI_API_KEY")
    replay.script(model, calls(("create_session", {"name": "kid", "agent_id": kid,
                                                   "description": script(scripted_say("kid done"))})),
                  say("the kid is on it"))

    created = await runtime.create_root(scope, input_text="Delegate the work.", agent_id=lead)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert (result["status"], result["output"]) == ("completed", "the kid is on it")

    first, second = replay.requests_for(model)
    assert {t["function"]["name"] for t in first.body["tools"]} >= {"create_session", "wait_inputs"}
    tool_result = json.loads(second.body["messages"][-1]["content"])
    kid_result = await runtime.wait_result(scope, uuid.UUID(tool_result["input_id"]), timeout=60)
    assert (kid_result["status"], kid_result["output"]) == ("completed", "kid done")
    # The key the agent names reached the provider, and only as the Authorization header.
    key = (_secrets_dir(runtime) / "OPENAI_API_KEY").read_text()
    assert key == MARKER and first.authorization == second.authorization == f"Bearer {MARKER}"
    assert [(c["model"], c["error"], c["prompt_tokens"], c["completion_tokens"])
            for c in await _model_calls(runtime, created["session"]["session_id"], 2)] == [
        (f"openai/{model} @ {replay.base_url}", None, 11, 7)] * 2


async def test_a_reply_past_the_size_limit_fails_its_turn_and_is_charged(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """A reply past CANOPY_MAX_REPLY_CHARS is not kept, but the provider billed it: its tokens are the
    call's record and count on the Run and its tree, or a budget never sees a flood it can repeat."""
    model = _name("replay-flood")
    agent = await _agent(runtime, scope, f"openai/{model}", api_base=replay.base_url)
    flood = "z" * (runtime.settings.max_reply_chars + 10)
    replay.script(model, {"say": flood, "usage": {"prompt_tokens": 12, "completion_tokens": 300_000,
                                                   "total_tokens": 300_012}})
    created = await runtime.create_root(scope, input_text="Write a lot.", agent_id=agent)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "failed" and "CANOPY_MAX_REPLY_CHARS" in (result["error"] or ""), result
    [call] = await _model_calls(runtime, created["session"]["session_id"], 1)
    assert (call["prompt_tokens"], call["completion_tokens"]) == (12, 300_000) and "characters" in call["error"]
    charged = await rows(runtime.db, "SELECT sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion "
                         "FROM runs WHERE session_id = %s", created["session"]["session_id"])
    assert (charged[0]["prompt"], charged[0]["completion"]) == (12, 300_000)
    messages = await rows(runtime.db, "SELECT role FROM thread_messages WHERE session_id = %s AND role = 'assistant'",
                          created["session"]["session_id"])
    assert messages == []  # not kept


async def test_a_cost_budget_stops_a_tree_whose_model_has_no_price(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """litellm has no price for an agent's own model: its calls cost "0", and a cost budget would never
    be reached while the provider bills them. Such a call under a cost budget stops the tree before
    the next call, and says why; without a cost budget the tree runs on and counts them."""
    model = _name("replay-unpriced")
    agent = await _agent(runtime, scope, f"openai/{model}", api_base=replay.base_url)
    replay.script(model, calls(("list_agents", {})), say("never asked"))
    capped = await runtime.create_root(scope, input_text="Spend.", agent_id=agent, budget={"max_cost_usd": 5.0})
    result = await runtime.wait_result(scope, capped["input"]["input_id"], timeout=60)
    assert result["status"] == "cancelled" and "no price" in (result["error"] or ""), result
    assert len(replay.requests_for(model)) == 1, "no call starts once the budget cannot count one"
    tree_id = capped["session"]["tree_id"]
    summary = await runtime.tree_summary(scope, tree_id)
    assert (summary["stopped"], summary["stop_reason"]) == (True, "budget_exceeded")
    assert summary["stop_detail"] == {"budget_tree_id": str(tree_id), "limit": "unpriced_calls", "max": 0.0,
                                      "used": 1.0}
    assert summary["usage"]["unpriced_calls"] == 1 and summary["usage"]["cost_usd"] == 0.0
    assert "$0.0000 (+ 1 call with no price)" in views.usage_line(summary)  # the CLI's usage line
    [member] = summary["members"]
    assert (member["usage"]["unpriced_calls"], member["usage"]["model_calls"]) == (1, 1), "the member's share"
    [counted] = await rows(runtime.db, "SELECT unpriced_calls, model_calls FROM tree_usage WHERE tree_id = %s",
                           tree_id)
    assert (counted["unpriced_calls"], counted["model_calls"]) == (1, 1)
    with pytest.raises(Conflict, match="max_cost_usd"):
        await runtime.continue_tree(scope, tree_id)  # raising the limit would not help: the fix is named
    raised = await runtime.set_budget(scope, tree_id, {"max_cost_usd": 50.0})
    assert raised["budget_reached"]["limit"] == "unpriced_calls"
    removed = await runtime.set_budget(scope, tree_id, {"max_cost_usd": None, "max_tokens": 10**6})
    assert removed["budget_reached"] is None
    await runtime.continue_tree(scope, tree_id)
    assert (await runtime.tree_summary(scope, tree_id))["stopped"] is False

    replay.script(model, calls(("list_agents", {})), say("done"))
    uncapped = await runtime.create_root(scope, input_text="Spend.", agent_id=agent, budget={"max_tokens": 10**6})
    result = await runtime.wait_result(scope, uncapped["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "done")
    summary = await runtime.tree_summary(scope, uncapped["session"]["tree_id"])
    assert summary["stopped"] is False and summary["usage"]["unpriced_calls"] == 2


async def test_a_provider_key_reaches_the_gateway_only(runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    model = _name("replay-key")
    agent = await _agent(runtime, scope, f"openai/{model}", api_base=replay.base_url, api_key_ref="OPENAI_API_KEY")
    replay.script(model, say("keyed"))
    created = await runtime.create_root(scope, input_text="Use the key.", agent_id=agent)
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "keyed"
    assert replay.requests_for(model)[0].authorization == f"Bearer {MARKER}"

    key_file = _secrets_dir(runtime) / "OPENAI_API_KEY"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "OPENAI_API_KEY" not in os.environ, "the driver gave the variable up when it started Ray"
    processes = psutil.Process().children(recursive=True)
    assert any("raylet" in " ".join(p.cmdline()) for p in processes)
    for process in processes:
        try:
            environ = Path(f"/proc/{process.pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a worker that ended meanwhile
        assert MARKER.encode() not in environ + cmdline, f"the key is in process {process.pid}'s environ or cmdline"
    session_dir = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    logs = [path for path in session_dir.rglob("*") if path.is_file() and not path.is_symlink()]
    assert any(path.suffix in (".out", ".err", ".log") for path in logs)
    assert [path for path in logs if MARKER.encode() in path.read_bytes()] == []


async def test_a_429_with_retry_after_is_waited_out_then_retried(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    model = _name("replay-b")
    agent = await _agent(runtime, scope, f"openai/{model}", api_base=replay.base_url, api_key_ref="OPENAI_API_KEY")
    replay.script(model, fail(429, **{"Retry-After": "1"}), say("after the wait"))
    created = await runtime.create_root(scope, agent_id=agent)
    tree_id = created["session"]["tree_id"]
    await runtime.watch_tree(scope, tree_id)  # the call is streamed: the streaming path retries too
    receipt = await runtime.submit_input(scope, tree_id, "Try, wait, try again.")

    result = await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "after the wait")
    first, second = replay.requests_for(model)
    assert first.body.get("stream") and second.body.get("stream")
    assert second.at - first.at >= 1.0, "the retry came before the server's Retry-After"
    recorded = await _model_calls(runtime, tree_id, 2)
    assert [c["model"] for c in recorded] == [f"openai/{model} @ {replay.base_url}"] * 2
    assert "429" in recorded[0]["error"] and recorded[1]["error"] is None


async def test_a_failing_model_falls_back_to_the_next_of_the_models_file(
        runtime: Runtime, scope: Scope, replay: ReplayServer, models_file: Path) -> None:
    replay.script("primary-c", then=fail(500))
    replay.script("backup-c", say("from the backup"))
    seen = len(replay.requests_for("primary-c")), len(replay.requests_for("backup-c"))  # the other shape's run
    agent = await _agent(runtime, scope, "flaky-primary")
    created = await runtime.create_root(scope, input_text="Answer somehow.", agent_id=agent)

    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert (result["status"], result["output"]) == ("completed", "from the backup")
    tries = runtime.settings.model_retries + 1
    assert (len(replay.requests_for("primary-c")) - seen[0], len(replay.requests_for("backup-c")) - seen[1]) == \
        (tries, 1)
    recorded = await _model_calls(runtime, created["session"]["session_id"], tries + 1)
    assert [c["model"] for c in recorded] == ["flaky-primary"] * tries + ["steady-backup"]
    assert all("500" in c["error"] for c in recorded[:-1]) and recorded[-1]["error"] is None
    assert recorded[-1]["completion_tokens"] == 7


async def _agents(runtime: Runtime, scope: Scope) -> list[Row]:
    return await rows(runtime.db, "SELECT agent_id, model, api_base, api_key_ref FROM agents WHERE app_id = %s",
                      scope.app_id)


@pytest.mark.parametrize(("fields", "named"), [
    ({"model": "openai/gpt-4o-mini", "api_key_ref": "REPLAY_NO_SUCH_KEY"}, "REPLAY_NO_SUCH_KEY"),
    ({"model": "mistral/mistral-small-latest"}, "MISTRAL_API_KEY"),
    ({"model": "openai/gpt-4o-mini", "api_key_ref": "lower_case"}, "api_key_ref"),
    ({"model": "openai/gpt-4o-mini", "api_key_ref": "CANOPY_ADMIN_TOKEN"}, "CANOPY_ADMIN_TOKEN"),
    ({"model": "no-provider-knows-this"}, "no-provider-knows-this"),
    ({"model": "openai/gpt-4o-mini", "api_base": "file:///etc/passwd"}, "api_base"),
    # Credentials in the URL: whoever reads it takes the allowed-looking part for a user name.
    ({"model": "openai/gpt-4o-mini", "api_base": "http://gpu-box:8000@elsewhere.example/v1"}, "credentials"),
    ({"model": "openai/gpt-4o-mini", "api_base": "http://[::1/v1"}, "not a URL"),
])
async def test_an_unusable_model_or_key_is_refused_and_nothing_is_written(
        runtime: Runtime, scope: Scope, fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgument, match=named) as refused:
        await runtime.create_agent(scope, {"agent_id": "refused", "name": "refused", **fields})
    assert status_of(refused.value) == 422  # what the API answers
    assert await _agents(runtime, scope) == []


async def test_an_edit_to_an_unusable_key_is_refused_and_changes_nothing(
        runtime: Runtime, scope: Scope, replay: ReplayServer, models_file: Path) -> None:
    agent = await _agent(runtime, scope, "openai/replay-edit", api_base=replay.base_url,
                         api_key_ref="OPENAI_API_KEY")
    before = await _agents(runtime, scope)
    with pytest.raises(InvalidArgument, match="REPLAY_NO_SUCH_KEY"):
        await runtime.update_agent(scope, agent, {"api_key_ref": "REPLAY_NO_SUCH_KEY"})
    # A model of the models file brings its own endpoint and key: an agent cannot redirect it.
    with pytest.raises(InvalidArgument, match="models file"):
        await runtime.update_agent(scope, agent, {"model": "flaky-primary"})
    assert await _agents(runtime, scope) == before
    cleared = await runtime.update_agent(scope, agent, {"model": "flaky-primary", "api_base": None,
                                                         "api_key_ref": None})
    assert (cleared["model"], cleared["api_base"], cleared["api_key_ref"]) == ("flaky-primary", None, None)
