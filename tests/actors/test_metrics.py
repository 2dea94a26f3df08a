"""Canopy's metrics where they are recorded: the durable counters every process adds to, and the same
names through ``ray.util.metrics``, read back from Ray's own Prometheus export."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path

import pytest
import yaml

from actors.gateway_actor import AccountedGateway
from actors.model_gateway import ModelError
from actors.runtime import Runtime
from actors.scripted import call, say, script
from persistence.db import Database
from persistence.metrics import MAX_MODEL_LABELS
from persistence.records import Scope
from persistence.settings import get_settings
from tests.actors import replay_server
from tests.actors.helpers import eventually, failing_once, ray_prometheus_text, rows
from tests.actors.replay_server import ReplayServer


def _samples(text: str, name: str) -> dict[str, float]:
    """``labels -> value`` of one metric family's samples."""
    found = {}
    for match in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        found[match.group(1) or ""] = float(match.group(2))
    return found


async def _counter(db: Database, name: str, **labels: str) -> float:
    """The durable counter's value summed over its rows whose labels include ``labels``."""
    found = await rows(db, "SELECT coalesce(sum(value), 0) AS n FROM metric_counters "
                                   "WHERE name = %s AND labels @> %s::jsonb", name, json.dumps(labels))
    return float(found[0]["n"])


async def test_counts_of_a_turn_reach_the_counters_table(runtime: Runtime, scope: Scope) -> None:
    # Each figure before, with the labels it is checked with after: other tests' counts under other
    # labels (Turns stopped by a budget, failed model calls) must not raise the bar.
    counted = {"model_calls": ("canopy_model_calls", {"model": "canopy/scripted", "outcome": "ok"}),
               "completed": ("canopy_turns_ended", {"status": "completed"}),
               "latency": ("canopy_model_latency_seconds_count", {}),
               "commands_ok": ("canopy_sandbox_commands", {"outcome": "ok"}),
               "commands_failed": ("canopy_sandbox_commands", {"outcome": "failed"})}
    before = {key: await _counter(runtime.db, name, **labels) for key, (name, labels) in counted.items()}

    async def grown(key: str, by: float) -> bool:
        name, labels = counted[key]
        return await _counter(runtime.db, name, **labels) >= before[key] + by

    text = script(call(("list_sessions", {})), call(("no_such_tool", {})),
                  call(("run_command", {"command": "echo hi"})), call(("run_command", {"command": "exit 3"})),
                  say("listed"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"])
    assert result["status"] == "completed"

    async def arrived() -> bool:  # each figure of this Turn, whichever process counted it
        return (await grown("model_calls", 5) and await grown("completed", 1) and await grown("latency", 5)
                and await grown("commands_ok", 1) and await grown("commands_failed", 1)
                and await _counter(runtime.db, "canopy_tool_calls", tool="list_sessions", outcome="ok") >= 1
                and await _counter(runtime.db, "canopy_tool_calls", tool="other", outcome="refused") >= 1  # made up
                and await _counter(runtime.db, "canopy_tool_calls", tool="run_command", outcome="ok") >= 2)

    # Each process flushes its own counts about a second after they happen (a session process, the
    # gateway, the sandbox host: not together), and a flush that failed (a busy database) is retried
    # up to 30 s later: all arrive within a minute and a half.
    await eventually(arrived, timeout=90)


async def test_model_calls_and_turns_reach_rays_metrics_export(runtime: Runtime, scope: Scope) -> None:
    created = await runtime.create_root(scope, input_text=script(say("measured", delay_ms=50)))
    result = await runtime.wait_result(scope, created["input"]["input_id"])
    assert result["status"] == "completed"

    async def exported() -> str | None:
        text = await asyncio.to_thread(ray_prometheus_text)
        calls = _samples(text, "ray_canopy_model_calls_total")
        ended = _samples(text, "ray_canopy_turns_ended_total")
        ok_calls = sum(value for labels, value in calls.items()
                       if 'model="canopy/scripted"' in labels and 'outcome="ok"' in labels)
        completed = sum(value for labels, value in ended.items() if 'status="completed"' in labels)
        return text if ok_calls >= 1 and completed >= 1 else None

    text = await eventually(exported, timeout=90, every=1.0)
    latency = _samples(text, "ray_canopy_model_latency_seconds_count")
    assert any('model="canopy/scripted"' in labels and value >= 1 for labels, value in latency.items()), latency
    tokens = _samples(text, "ray_canopy_model_tokens_total")
    assert any('kind="prompt"' in labels and value >= 1 for labels, value in tokens.items()), tokens

    async def gauges() -> str | None:  # published by the sweeper every few seconds
        text = await asyncio.to_thread(ray_prometheus_text)
        return text if _samples(text, "ray_canopy_slots_in_use") and _samples(text, "ray_canopy_turns") else None

    text = await eventually(gauges, timeout=60, every=1.0)
    assert _samples(text, "ray_canopy_queue_depth"), "the queue-depth gauge is exported"
    statuses = _samples(text, "ray_canopy_turns")
    assert any('status="waiting"' in labels and 'waiting_for="approval"' in labels for labels in statuses), statuses


async def test_a_tool_call_is_counted_when_its_result_commits(runtime: Runtime, scope: Scope) -> None:
    """The commit of a step's results fails (a passing database error): the Run is recovered and the
    step, a read, runs again. Its call is counted once, by the commit that kept its result."""
    counted = {"tool": "get_result", "outcome": "error"}  # a call hardly any other test makes
    before = await _counter(runtime.db, "canopy_tool_calls", **counted)
    created = await runtime.create_root(scope)
    session_id = created["session"]["session_id"]
    text = script(call(("get_result", {"input_id": str(uuid.uuid4())})), say("looked"))
    async with failing_once(runtime.db, "thread_messages", f"NEW.session_id = '{session_id}' AND NEW.role = 'tool'"):
        receipt = await runtime.submit_input(scope, session_id, text)
        result = await runtime.wait_result(scope, receipt["input_id"], timeout=90)
    assert (result["status"], result["output"]) == ("completed", "looked"), result
    runs = await rows(runtime.db, "SELECT error FROM runs WHERE turn_id = %s ORDER BY queued_at", receipt["turn_id"])
    assert len(runs) == 2 and "lease expired" in runs[0]["error"], runs  # the step ran twice

    async def once() -> bool:
        return await _counter(runtime.db, "canopy_tool_calls", **counted) == before + 1

    await eventually(once, timeout=60)
    await asyncio.sleep(3)  # a second count would have been flushed by now (each process flushes within ~1 s)
    assert await _counter(runtime.db, "canopy_tool_calls", **counted) == before + 1


async def test_the_operators_own_models_keep_their_label_whatever_else_was_called(
        database_url: str, db: Database, replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Model labels are bounded: the first names counted take the places, then ``other``. A
    tenant's agents calling made-up models first took them all, and the operator's own model (a
    name of the models file) was counted as ``other``. It keeps its label now."""
    monkeypatch.setenv("CANOPY_DATABASE_URL", database_url)
    get_settings.cache_clear()
    own = f"ops-{uuid.uuid4().hex[:8]}"
    models_file = tmp_path / "models.yaml"
    models_file.write_text(yaml.safe_dump({"model_list": [{"model_name": own, "litellm_params": {
        "model": f"openai/{own}", "api_base": replay.base_url, "api_key": "sk-file"}}]}))
    gateway = AccountedGateway(timeout_seconds=30, retries=0, models_file=str(models_file),
                               agent_api_bases=(replay.base_url,))
    made_up = [f"junk-{uuid.uuid4().hex[:8]}" for _ in range(MAX_MODEL_LABELS + 2)]
    try:
        for model in [*made_up, own]:
            replay.script(model, replay_server.say("hi"))
            await gateway.complete_for_run(call_id=str(uuid.uuid4()), run_id=str(uuid.uuid4()),
                                           model=model if model == own else f"openai/{model}",
                                           messages=[{"role": "user", "content": "hi"}], tools=None,
                                           api_base=None if model == own else replay.base_url)
    finally:
        await gateway.close()  # records the calls and flushes their counts
        get_settings.cache_clear()

    assert await _counter(db, "canopy_model_calls", model=own) == 1.0
    assert await _counter(db, "canopy_model_calls", model=f"openai/{made_up[-1]}") == 0.0  # still bounded


async def test_an_agents_own_endpoint_is_counted_apart_from_the_model_it_names(
        database_url: str, db: Database, replay: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's own endpoint may name any model (``openai/gpt-4o-mini``) and report any usage: its
    calls are counted and recorded under the model and the endpoint, never in the series of the
    model the operator's shared route serves under that name."""
    monkeypatch.setenv("CANOPY_DATABASE_URL", database_url)
    get_settings.cache_clear()
    gateway = AccountedGateway(timeout_seconds=30, retries=0, agent_api_bases=(replay.base_url,))
    before = await _counter(db, "canopy_model_calls", model="openai/gpt-4o-mini")
    run_id, refused_id = uuid.uuid4(), uuid.uuid4()
    unlisted = "http://127.0.0.1:7/v1"
    replay.script("gpt-4o-mini", replay_server.say("hi"))
    try:
        await gateway.complete_for_run(call_id=str(uuid.uuid4()), run_id=str(run_id), model="openai/gpt-4o-mini",
                                       messages=[{"role": "user", "content": "hi"}], tools=None,
                                       api_base=replay.base_url)
        with pytest.raises(ModelError, match="not one of the endpoints"):  # refused before any request
            await gateway.complete_for_run(call_id=str(uuid.uuid4()), run_id=str(refused_id),
                                           model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                           tools=None, api_base=unlisted)
    finally:
        await gateway.close()
        get_settings.cache_clear()

    apart = f"openai/gpt-4o-mini @ {replay.base_url}"
    assert await _counter(db, "canopy_model_calls", model="openai/gpt-4o-mini") == before  # its own label, or other
    recorded = await rows(db, "SELECT model FROM model_calls WHERE run_id = %s", run_id)
    assert [row["model"] for row in recorded] == [apart]
    refused = await rows(db, "SELECT model, error FROM model_calls WHERE run_id = %s", refused_id)
    assert [row["model"] for row in refused] == [f"openai/gpt-4o-mini @ {unlisted}"] and refused[0]["error"]

