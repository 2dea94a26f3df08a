"""Runtime metrics through ``ray.util.metrics``, read back from Ray's own Prometheus export."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import ray

from actors.runtime import Runtime
from actors.scripted import say, script
from persistence.records import Scope
from tests.actors.helpers import eventually, rows


def _ray_prometheus_text() -> str:
    """Every node's metrics agent export (Ray prefixes application metrics with ``ray_``)."""
    texts = []
    for node in ray.nodes():
        if node["Alive"]:
            url = f"http://127.0.0.1:{node['MetricsExportPort']}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                texts.append(response.read().decode())
    return "\n".join(texts)


def _samples(text: str, name: str) -> dict[str, float]:
    """``labels -> value`` of one metric family's samples."""
    found = {}
    for match in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        found[match.group(1) or ""] = float(match.group(2))
    return found


async def test_model_calls_and_turn_gauges_reach_rays_metrics_export(runtime: Runtime, scope: Scope) -> None:
    created = await runtime.create_root(scope, input_text=script(say("measured", delay_ms=50)))
    result = await runtime.wait_result(scope, created["input"]["input_id"])
    assert result["status"] == "completed"
    completed_turns = (await rows(runtime.db, "SELECT count(*) AS n FROM turns WHERE status = 'completed'"))[0]["n"]

    async def exported() -> str | None:
        text = await asyncio.to_thread(_ray_prometheus_text)
        calls = _samples(text, "ray_canopy_model_calls_total")
        turns = _samples(text, "ray_canopy_turns")
        done = next((value for labels, value in turns.items() if 'status="completed"' in labels), 0)
        ok_calls = sum(value for labels, value in calls.items()
                       if 'model="canopy/scripted"' in labels and 'outcome="ok"' in labels)
        return text if ok_calls >= 1 and done >= completed_turns else None

    text = await eventually(exported, timeout=90, every=1.0)
    latency = _samples(text, "ray_canopy_model_call_latency_seconds_count")
    assert any('model="canopy/scripted"' in labels and value >= 1 for labels, value in latency.items()), latency
    assert _samples(text, "ray_canopy_slots_in_use"), "the slot gauge is exported"
    assert _samples(text, "ray_canopy_queue_depth"), "the queue-depth gauge is exported"
