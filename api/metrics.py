"""``/metrics`` in Prometheus text, rendered by ``prometheus_client`` from one scrape's figures.

The metrics are those defined in ``persistence/metrics.py`` (Ray exports the same names with
its ``ray_`` prefix); the figures are whole-cluster — the counter rows every process adds to,
and the state gauges read through partial indexes — so whichever replica answers reports the
same. Every fixed label value is present (at zero when nothing happened yet), so a dashboard's
series exist from the first scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from persistence import metrics
from persistence.metrics import Figures

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Series = dict[tuple[str, ...], float]
# Counter series every dashboard expects from the start, at zero until something is counted.
_FIXED_SERIES: dict[str, list[tuple[str, ...]]] = {
    metrics.TURNS_ENDED.name: [(status,) for status in metrics.TURN_END_STATUSES],
    metrics.SANDBOX_COMMANDS.name: [(outcome,) for outcome in metrics.SANDBOX_OUTCOMES],
    metrics.SANDBOXES_MADE_ROOM.name: [(limit,) for limit in metrics.ROOM_LIMITS],
    **{metric.name: [()] for metric in (metrics.TURNS_STARTED, metrics.RECOVERIES, metrics.SESSIONS_CREATED,
                                         metrics.TREES_CREATED)},
}


class _Collector:
    """The families of one scrape (``generate_latest`` takes anything with ``collect``)."""

    def __init__(self, figures: Figures) -> None:
        self.rows: dict[str, Series] = {}
        for row in figures.counters:
            labels: dict[str, Any] = row["labels"]
            self.rows.setdefault(row["name"], {})[tuple(sorted(labels.items()))] = float(row["value"])  # type: ignore[arg-type]
        self.gauges = figures.gauges

    def _series(self, metric: metrics.Metric, name: str, extra: tuple[str, ...] = ()) -> Series:
        """``label values -> value`` of one stored row name, label values in the metric's order."""
        order = (*metric.labels, *extra)
        found: Series = {}
        for key, value in self.rows.get(name, {}).items():
            labels = dict(key)
            found[tuple(str(labels.get(label, "")) for label in order)] = value  # type: ignore[arg-type]
        return found

    def collect(self) -> Iterator[Metric]:
        for metric in metrics.METRICS:
            if metric.kind == "counter":
                yield self._counter(metric)
            elif metric.kind == "histogram":
                yield self._histogram(metric)
        yield from self._gauges()

    def _counter(self, metric: metrics.Metric) -> CounterMetricFamily:
        family = CounterMetricFamily(metric.name, metric.help, labels=metric.labels)
        series = {**dict.fromkeys(_FIXED_SERIES.get(metric.name, []), 0.0), **self._series(metric, metric.name)}
        for labels, value in sorted(series.items()):
            family.add_metric(list(labels), value)
        return family

    def _histogram(self, metric: metrics.Metric) -> HistogramMetricFamily:
        family = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
        buckets = self._series(metric, f"{metric.name}_bucket", ("le",))
        sums = self._series(metric, f"{metric.name}_sum")
        counts = self._series(metric, f"{metric.name}_count")
        for labels in sorted(counts):
            cumulative, running = [], 0.0
            for bound in [*(f"{b:g}" for b in metric.buckets), "+Inf"]:
                running += buckets.get((*labels, bound), 0.0)
                cumulative.append((bound, running))
            family.add_metric(list(labels), cumulative, sums.get(labels, 0.0))
        return family

    def _gauges(self) -> Iterator[GaugeMetricFamily]:
        gauges = self.gauges
        for metric, value in ((metrics.SLOTS_IN_USE, gauges["slots_in_use"]),
                              (metrics.RUNS_QUEUED, gauges["runs_queued"]),
                              (metrics.INPUTS_PENDING, gauges["inputs_pending"]),
                              (metrics.QUEUE_DEPTH, gauges["runs_queued"] + gauges["inputs_pending"]),
                              (metrics.REQUESTS_PENDING, gauges["requests_pending"]),
                              (metrics.EVENT_STREAMS_OPEN, gauges["event_streams_open"])):
            yield GaugeMetricFamily(metric.name, metric.help, value=value)
        turns = GaugeMetricFamily(metrics.OPEN_TURNS.name, metrics.OPEN_TURNS.help, labels=metrics.OPEN_TURNS.labels)
        for (status, waiting_for), count in sorted(metrics.open_turns(gauges).items()):
            turns.add_metric([status, waiting_for], count)
        yield turns
        trees = GaugeMetricFamily(metrics.TREES.name, metrics.TREES.help, labels=metrics.TREES.labels)
        for state in metrics.TREE_STATES:
            trees.add_metric([state], gauges[f"trees_{state}"])
        yield trees


def render(figures: Figures) -> bytes:
    return generate_latest(_Collector(figures))  # type: ignore[arg-type]
