"""Canopy's metrics through ``ray.util.metrics`` (SPEC §14), under the names ``/metrics`` shows.

The names, kinds, labels and buckets are defined once, in ``persistence/metrics.py``. Every
count and observation recorded there in a process that imports this module is mirrored to
Ray's metric of the same name, and Ray's metrics agent on each node serves them in
Prometheus text at the node's ``metrics_export_port`` with Ray's ``ray_`` prefix — so a Ray
cluster's Prometheus and the Ray dashboard see ``ray_canopy_*`` beside Ray's own figures. The
state gauges are published by the sweeper from the same statement ``/metrics`` reads, so the
figures agree whichever way they are read.

Metric objects are created on first use, inside the process that records them: a
``ray.util.metrics`` metric belongs to the worker that made it. Where Ray is not initialised
(a plain script on the persistence layer) only the durable counters count.
"""

from __future__ import annotations

import functools
from typing import Any

import ray
from ray.util import metrics as ray_metrics

from persistence import metrics
from persistence.db import Connection
from persistence.metrics import Metric


@functools.cache
def _ray_metric(metric: Metric) -> Any:
    if metric.kind == "counter":
        return ray_metrics.Counter(metric.name, metric.help, tag_keys=metric.labels)
    if metric.kind == "histogram":
        return ray_metrics.Histogram(metric.name, metric.help, boundaries=list(metric.buckets),
                                     tag_keys=metric.labels)
    return ray_metrics.Gauge(metric.name, metric.help, tag_keys=metric.labels)


def _mirror(metric: Metric, labels: dict[str, str], value: float) -> None:
    if not ray.is_initialized():
        return
    if metric.kind == "counter":
        _ray_metric(metric).inc(value, labels or None)
    else:
        _ray_metric(metric).observe(value, labels or None)


metrics.on_record(_mirror)


def record_model_call(model: str, latency_ms: float, usage: dict[str, int], cost_usd: float | None,
                      error: str | None) -> None:
    """One finished model call (``model`` is already a bounded label, see ``ModelLabels``; ``cost_usd``
    None: litellm has no price for it, and the cost series counts priced calls only)."""
    metrics.add(metrics.MODEL_CALLS, model=model, outcome="error" if error else "ok")
    metrics.observe(metrics.MODEL_LATENCY, latency_ms / 1000, model=model)
    for kind in ("prompt", "completion"):
        metrics.add(metrics.MODEL_TOKENS, usage.get(f"{kind}_tokens", 0), model=model, kind=kind)
    if cost_usd is not None:
        metrics.add(metrics.MODEL_COST, cost_usd, model=model)


def publish_gauges(gauges: dict[str, Any]) -> None:
    """Set Ray's state gauges from ``persistence.metrics.read_gauges``. Every label value is set
    each time, so a series whose last Turn moved on reads 0, not its old count."""
    for metric, key in ((metrics.SLOTS_IN_USE, "slots_in_use"), (metrics.RUNS_QUEUED, "runs_queued"),
                        (metrics.INPUTS_PENDING, "inputs_pending"), (metrics.REQUESTS_PENDING, "requests_pending"),
                        (metrics.EVENT_STREAMS_OPEN, "event_streams_open")):
        _ray_metric(metric).set(gauges[key])
    _ray_metric(metrics.QUEUE_DEPTH).set(gauges["runs_queued"] + gauges["inputs_pending"])
    for state in metrics.TREE_STATES:
        _ray_metric(metrics.TREES).set(gauges[f"trees_{state}"], {"state": state})
    for (status, waiting_for), count in metrics.open_turns(gauges).items():
        _ray_metric(metrics.OPEN_TURNS).set(count, {"status": status, "waiting_for": waiting_for})



@functools.cache
def _tool_names() -> frozenset[str]:
    from actors.toolbox import TOOLS  # imported on first use: the gateway and sweeper never need it

    return frozenset(TOOLS)


def tool_label(name: Any) -> str:
    """A tool call's label: the tool's name when Canopy has that tool, else ``other`` (a model
    may name anything)."""
    return metrics.bounded(name, _tool_names()) if isinstance(name, str) else metrics.OTHER


def count_tool_call(conn: Connection, name: Any, outcome: Any, *, refused: bool = False) -> None:
    """Count one tool call by its outcome (refused: not run; parked; error; ok) when the transaction
    holding its result commits: a step whose commit fails is redone, and its calls count once."""
    if refused:
        result = "refused"
    elif isinstance(outcome, dict):
        result = "error" if "error" in outcome else "ok"
    else:
        result = "parked"  # a Park: the Turn waits for the call's answer
    metrics.count_at_commit(conn, metrics.TOOL_CALLS, tool=tool_label(name), outcome=result)
