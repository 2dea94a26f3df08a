"""Prometheus text exposition of the runtime figures (persistence/metrics.py).

Computed from the database on every scrape, so whichever replica answers reports the
same, whole-cluster truth.
"""

from __future__ import annotations

from typing import Any

from persistence.metrics import LATENCY_BUCKETS_MS


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: Any) -> None:
        self.lines.append(f"{name}{_labels(labels)} {float(value):g}" if isinstance(value, float)
                          else f"{name}{_labels(labels)} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(figures: dict[str, Any]) -> str:
    out = _Exposition()
    gauges = [
        ("canopy_slots_in_use", "slots_in_use", "Runs holding an execution slot (running), all trees."),
        ("canopy_runs_queued", "runs_queued", "Runs waiting in their tree's FIFO for a slot."),
        ("canopy_inputs_pending", "inputs_pending", "Inputs queued behind a session's current Turn."),
        ("canopy_requests_pending", "requests_pending", "Approvals and questions waiting for a human."),
        ("canopy_trees_stopped", "trees_stopped", "Trees in the stopped state."),
        ("canopy_sessions", "sessions", "Sessions (all trees, archived included)."),
    ]
    for name, key, help_text in gauges:
        out.family(name, "gauge", help_text)
        out.sample(name, figures[key])
    out.family("canopy_queue_depth", "gauge", "Work waiting: queued Runs plus pending inputs.")
    out.sample("canopy_queue_depth", figures["runs_queued"] + figures["inputs_pending"])
    out.family("canopy_turns", "gauge", "Turns by status (and what a waiting Turn waits for).")
    for row in figures["turns"]:
        out.sample("canopy_turns", row["n"], status=row["status"], waiting_for=row["waiting_for"])
    out.family("canopy_runs", "gauge", "Runs by status.")
    for row in figures["runs"]:
        out.sample("canopy_runs", row["n"], status=row["status"])
    out.family("canopy_recoveries_total", "counter", "Runs recovered after their owner stopped heart-beating.")
    out.sample("canopy_recoveries_total", figures["recoveries"])
    _model_families(out, figures["models"])
    return out.text()


def _model_families(out: _Exposition, models: list[dict[str, Any]]) -> None:
    out.family("canopy_model_calls_total", "counter", "Model calls (at-least-once: retries and replays count).")
    for row in models:
        out.sample("canopy_model_calls_total", row["calls"], model=row["model"])
    out.family("canopy_model_errors_total", "counter", "Model calls that failed.")
    for row in models:
        out.sample("canopy_model_errors_total", row["errors"], model=row["model"])
    out.family("canopy_model_tokens_total", "counter", "Model tokens by kind.")
    for row in models:
        out.sample("canopy_model_tokens_total", row["prompt_tokens"], model=row["model"], kind="prompt")
        out.sample("canopy_model_tokens_total", row["completion_tokens"], model=row["model"], kind="completion")
    out.family("canopy_model_cost_usd_total", "counter", "Model cost in US dollars, as litellm prices it.")
    for row in models:
        out.sample("canopy_model_cost_usd_total", float(row["cost_usd"]), model=row["model"])
    out.family("canopy_model_latency_seconds", "histogram", "Model call latency.")
    for row in models:
        for bound in LATENCY_BUCKETS_MS:
            out.sample("canopy_model_latency_seconds_bucket", row[f"le_{bound}"], model=row["model"],
                       le=f"{bound / 1000:g}")
        out.sample("canopy_model_latency_seconds_bucket", row["calls"], model=row["model"], le="+Inf")
        out.sample("canopy_model_latency_seconds_sum", float(row["latency_ms_sum"]) / 1000, model=row["model"])
        out.sample("canopy_model_latency_seconds_count", row["calls"], model=row["model"])
