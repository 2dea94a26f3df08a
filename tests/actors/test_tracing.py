"""Opt-in OpenTelemetry spans, written by the ``file:`` exporter (a JSONL file per process) and read
back: Turn → Run → model call (in the gateway's process) and tool call, linked by their parents,
with the ids as attributes.

Tracing is read by every Ray process as it starts, so the scenario runs in a runtime and Ray
cluster of its own (a subprocess on a database of its own): see tracing_scenario.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from persistence.databases import create_database, drop_database
from tests.actors.helpers import REPO, scenario_findings
from tests.conftest import RUNTIME_ENV


def _spans(directory: Path) -> list[dict[str, Any]]:
    spans = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        for line in path.read_text().splitlines():
            spans.append({**json.loads(line), "file": path.name})
    return spans


async def test_a_turn_with_a_tool_call_is_traced_with_linked_spans(database_url: str, tmp_path: Path) -> None:
    spans_dir = tmp_path / "spans"
    scratch = create_database(database_url, "canopy_tracing")
    try:
        findings = await scenario_findings("tests.actors.tracing_scenario", {
            # Leases of the usual length: this test kills nothing, and a busy machine must not expire one.
            **RUNTIME_ENV, "CANOPY_LEASE_SECONDS": "30", "CANOPY_HEARTBEAT_SECONDS": "5",
            "CANOPY_OTEL_EXPORTER": f"file:{spans_dir}", "CANOPY_DATABASE_URL": scratch,
            "CANOPY_DATA_DIR": str(tmp_path / "data")}, timeout=300)
    finally:
        drop_database(scratch)
    assert findings["status"] == "completed"
    turn_id, run_ids = findings["turn_id"], findings["run_ids"]
    spans = _spans(spans_dir)
    trace_id = f"0x{int(turn_id.replace('-', ''), 16):032x}"  # the Turn's trace: its id's 128 bits
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        if span["context"]["trace_id"] == trace_id:
            by_name.setdefault(span["name"], []).append(span)
            assert span["attributes"]["canopy.turn_id"] == turn_id, span

    (turn,) = by_name["turn"]
    assert turn["parent_id"] is None
    assert turn["attributes"]["canopy.status"] == "completed"
    assert turn["attributes"]["canopy.session_id"] == findings["session_id"]
    assert turn["attributes"]["canopy.tree_id"] == findings["tree_id"]

    runs = {span["context"]["span_id"]: span for span in by_name["run"]}  # one, unless a Run was recovered
    for run in runs.values():
        assert run["parent_id"] == turn["context"]["span_id"] and run["context"]["trace_id"] == trace_id
        assert run["attributes"]["canopy.run_id"] in run_ids
        assert turn["start_time"] <= run["start_time"] and run["end_time"] <= turn["end_time"]

    models = by_name["model call"]
    assert len(models) >= 2  # the reply with the tool call, then the answer
    for model in models:
        run = runs[model["parent_id"]]  # a child of a Run's span...
        assert model["context"]["trace_id"] == trace_id
        assert model["attributes"]["canopy.run_id"] == run["attributes"]["canopy.run_id"]
        assert model["attributes"]["canopy.model"] == "canopy/scripted"
        assert model["file"] != run["file"]  # ...though written by the gateway's process, not the session's
        assert run["start_time"] <= model["start_time"] and model["end_time"] <= run["end_time"]

    tools = by_name["tool call"]
    assert tools
    for tool in tools:
        run = runs[tool["parent_id"]]
        assert tool["file"] == run["file"] and tool["end_time"] <= run["end_time"]
        assert tool["attributes"]["canopy.tool"] == "list_sessions"
        assert tool["attributes"]["canopy.run_id"] == run["attributes"]["canopy.run_id"]
    # Spans carry ids, never what the model was told or said.
    assert all("trace this" not in json.dumps(span) for span in spans)


_OFF = """
import asyncio, sys, uuid
from actors import agent_loop, gateway_actor, tracing
from persistence.records import RunRef, Scope

async def run_a_step():
    run = RunRef(Scope("u", "a"), uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "owner")
    async with tracing.run_span(None, run):
        with tracing.span("tool call", tool="x"), tracing.remote_span("model call", {}, model="m"):
            assert tracing.carrier() == {}
        tracing.turn_ended("completed")

asyncio.run(run_a_step())
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def test_tracing_off_imports_no_opentelemetry() -> None:
    """Unset, the span helpers do nothing, and the hot path's modules never import OpenTelemetry."""
    env = {key: value for key, value in os.environ.items() if key != "CANOPY_OTEL_EXPORTER"}
    done = subprocess.run([sys.executable, "-c", _OFF], env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
