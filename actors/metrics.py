"""Runtime metrics exported through ``ray.util.metrics`` (SPEC §14), beside ``/metrics``.

Ray's metrics agent on each node serves these in Prometheus text at the node's
``metrics_export_port`` (Ray prefixes them with ``ray_``), so a Ray cluster's Prometheus
and dashboard see Canopy beside Ray's own figures. Events are counted where they happen
(the gateway counts model calls, the sweeper recoveries); the slot, queue and turn
figures are *state*, so the sweeper publishes them as gauges from the same database
query that ``/metrics`` uses — the figures agree whichever way they are read.

Metric objects are created on first use, inside the process that records them: a
``ray.util.metrics`` metric belongs to the worker that made it.
"""

from __future__ import annotations

import functools
from typing import Any

from ray.util import metrics

from persistence.metrics import LATENCY_BUCKETS_MS
from persistence.records import OPEN_TURN_STATUSES, TERMINAL_TURN_STATUSES


@functools.cache
def _model_latency() -> metrics.Histogram:
    return metrics.Histogram("canopy_model_call_latency_seconds", "Model call latency, retries included.",
                             boundaries=[bound / 1000 for bound in LATENCY_BUCKETS_MS], tag_keys=("model",))


@functools.cache
def _model_calls() -> metrics.Counter:
    return metrics.Counter("canopy_model_calls", "Model calls (at-least-once).", tag_keys=("model", "outcome"))


@functools.cache
def _model_tokens() -> metrics.Counter:
    return metrics.Counter("canopy_model_tokens", "Model tokens by kind.", tag_keys=("model", "kind"))


@functools.cache
def _recoveries() -> metrics.Counter:
    return metrics.Counter("canopy_recoveries", "Runs recovered after their owner stopped heart-beating.")


@functools.cache
def _gauge(name: str, description: str, tag_keys: tuple[str, ...] = ()) -> metrics.Gauge:
    return metrics.Gauge(name, description, tag_keys=tag_keys)


def record_model_call(model: str, latency_ms: float, usage: dict[str, int], error: str | None) -> None:
    tags = {"model": model}
    _model_latency().observe(latency_ms / 1000, tags)
    _model_calls().inc(1, {**tags, "outcome": "error" if error else "ok"})
    for kind in ("prompt_tokens", "completion_tokens"):
        if usage.get(kind):
            _model_tokens().inc(usage[kind], {**tags, "kind": kind})


def record_recovery() -> None:
    _recoveries().inc()


def publish_runtime_gauges(figures: dict[str, Any]) -> None:
    """Set the state gauges from ``persistence.metrics.runtime_metrics``."""
    _gauge("canopy_slots_in_use", "Runs holding an execution slot, all trees.").set(figures["slots_in_use"])
    _gauge("canopy_queue_depth", "Queued Runs plus pending inputs.").set(
        figures["runs_queued"] + figures["inputs_pending"])
    _gauge("canopy_requests_pending", "Approvals and questions waiting for a human.").set(figures["requests_pending"])
    turns = _gauge("canopy_turns", "Turns by status.", ("status",))
    # Every status is set each time, so a status whose last Turn moved on reads 0, not its old count.
    by_status: dict[str, int] = dict.fromkeys(sorted(OPEN_TURN_STATUSES | TERMINAL_TURN_STATUSES), 0)
    for row in figures["turns"]:
        by_status[row["status"]] = by_status.get(row["status"], 0) + row["n"]
    for status, count in by_status.items():
        turns.set(count, {"status": status})
