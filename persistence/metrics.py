"""Canopy's metrics: one set of names, recorded where things happen, read whole-cluster on a scrape.

Canopy runs in many processes (session actors or hosts, tree supervisors, the gateway, the
sweeper, API replicas), while ``/metrics`` is answered by whichever API replica the scraper
reaches. So every figure is one of two kinds, and neither costs a table scan on a scrape:

- **Counters and histograms** (things that happen: model calls, tokens, cost, latencies,
  Turns ended, recoveries, tool calls, sandbox commands, slot waits) are counted in the
  process where they happen, into a per-process buffer (``add``, ``observe``, or
  ``count_at_commit`` for a change committed by a transaction), and the buffer is added
  to the ``metric_counters`` table — one row per metric and label set — in one statement
  about once a second (``FLUSH_SECONDS``, scheduled by ``Database.tx`` after a commit).
  The hot paths thus never touch a shared counter row; a row is updated at most once a
  second per process. A histogram is stored as its buckets (non-cumulative, one row each),
  its sum and its count. A process that dies loses at most its last second of counts (as
  the gateway's model-call records lose their last 50 ms).
- **State gauges** (slots in use, Runs queued, inputs pending, requests pending, open Turns
  by status and what they wait for, busy and stopped trees, open event streams) are read
  at the scrape by one statement (``metric_gauges.sql``) in which every count is answered by
  a partial index over the few rows that are in that state now — never a whole table. The
  scrape's transaction turns sequential scans off (``metric_scrape_guard.sql``): on small
  tables, or on a large one whose statistics are stale after a burst, the planner would
  otherwise pick a scan, and a scrape must cost the same whatever the tables hold.

Each figure is also recorded through ``ray.util.metrics`` by ``actors/metrics.py`` (a
mirror registered with ``on_record``, and the sweeper publishing the gauges), so a Ray
cluster's Prometheus and the Ray dashboard see the same names with Ray's ``ray_`` prefix;
``api/metrics.py`` renders the same definitions on ``/metrics`` with ``prometheus_client``.

Label values are bounded: statuses, outcomes and kinds are fixed sets; tool names are the
tools Canopy has (anything else is ``other``); model names are the configured default model,
the models file's names and the first ``MAX_MODEL_LABELS`` others counted (``ModelLabels``),
anything else ``other``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Literal

from psycopg.types.json import Jsonb

from persistence.statuses import OPEN_TURN_STATUSES, TERMINAL_TURN_STATUSES, TurnStatus, WaitingFor

if TYPE_CHECKING:
    from persistence.db import Connection, Database

log = logging.getLogger(__name__)

Kind = Literal["counter", "gauge", "histogram"]
OTHER = "other"
# Distinct model labels beyond the default model; later models are counted as "other".
MAX_MODEL_LABELS = 20
# How long a process gathers its counts before adding them to the table in one statement.
FLUSH_SECONDS = 1.0
# A flush that failed is retried after a delay that doubles up to this.
_MAX_RETRY_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric. ``name`` is the family name: a counter's samples are ``<name>_total``, a
    histogram's ``<name>_bucket``, ``_sum`` and ``_count`` (in prometheus_client and Ray alike)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def samples(self) -> tuple[str, ...]:
        """The sample names a scraper sees."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        return (self.name,)


LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SLOT_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

# Things that happen (durable counters).
TURNS_STARTED = Metric("canopy_turns_started", "counter", "Turns started.")
TURNS_ENDED = Metric("canopy_turns_ended", "counter", "Turns ended, by terminal status.", ("status",))
RECOVERIES = Metric("canopy_recoveries", "counter", "Runs recovered after their owner stopped heart-beating.")
SESSIONS_CREATED = Metric("canopy_sessions_created", "counter", "Sessions created (roots and members).")
TREES_CREATED = Metric("canopy_trees_created", "counter", "Trees created (one per root session).")
MODEL_CALLS = Metric("canopy_model_calls", "counter", "Model calls (at-least-once: retries and replays count).",
                     ("model", "outcome"))
MODEL_LATENCY = Metric("canopy_model_latency_seconds", "histogram", "Model call latency, retries included.",
                       ("model",), LATENCY_BUCKETS)
MODEL_TOKENS = Metric("canopy_model_tokens", "counter", "Model tokens by kind.", ("model", "kind"))
MODEL_COST = Metric("canopy_model_cost_usd", "counter", "Model cost in US dollars, as litellm prices it.", ("model",))
TOOL_CALLS = Metric("canopy_tool_calls", "counter", "Tool calls by tool and outcome (refused: not run).",
                    ("tool", "outcome"))
SANDBOX_COMMANDS = Metric("canopy_sandbox_commands", "counter", "Sandbox commands by outcome.", ("outcome",))
SANDBOXES_MADE_ROOM = Metric(
    "canopy_sandboxes_made_room", "counter",
    "Idle sandboxes released before their idle time to make room for another: the engine was full "
    "(engine) or their user held the most they may (scope).", ("limit",))
SLOT_WAIT = Metric("canopy_slot_wait_seconds", "histogram", "How long a Run waited in its tree's queue for a slot.",
                   (), SLOT_WAIT_BUCKETS)

# State (gauges read at the scrape, published to Ray by the sweeper).
SLOTS_IN_USE = Metric("canopy_slots_in_use", "gauge", "Runs holding an execution slot (running), all trees.")
RUNS_QUEUED = Metric("canopy_runs_queued", "gauge", "Runs waiting in their tree's FIFO for a slot.")
INPUTS_PENDING = Metric("canopy_inputs_pending", "gauge", "Inputs queued behind a session's current Turn.")
QUEUE_DEPTH = Metric("canopy_queue_depth", "gauge", "Work waiting: queued Runs plus pending inputs.")
REQUESTS_PENDING = Metric("canopy_requests_pending", "gauge", "Approvals and questions waiting for a human.")
OPEN_TURNS = Metric("canopy_turns", "gauge", "Open Turns by status, and what a waiting Turn waits for.",
                    ("status", "waiting_for"))
TREES = Metric("canopy_trees", "gauge", "Trees by state: busy (a Run holds or awaits a slot) and stopped.",
               ("state",))
EVENT_STREAMS_OPEN = Metric("canopy_event_streams_open", "gauge", "Open API event streams, all replicas.")

METRICS: tuple[Metric, ...] = (
    TURNS_STARTED, TURNS_ENDED, RECOVERIES, SESSIONS_CREATED, TREES_CREATED, MODEL_CALLS, MODEL_LATENCY,
    MODEL_TOKENS, MODEL_COST, TOOL_CALLS, SANDBOX_COMMANDS, SANDBOXES_MADE_ROOM, SLOT_WAIT,
    SLOTS_IN_USE, RUNS_QUEUED, INPUTS_PENDING, QUEUE_DEPTH, REQUESTS_PENDING, OPEN_TURNS, TREES, EVENT_STREAMS_OPEN,
)

# The fixed label values, so a dashboard sees every series (at zero) from the start.
TURN_END_STATUSES = tuple(sorted(TERMINAL_TURN_STATUSES))
OPEN_TURN_SERIES = tuple(sorted({(status, "") for status in OPEN_TURN_STATUSES if status != TurnStatus.WAITING}
                                | {(TurnStatus.WAITING, kind) for kind in WaitingFor}))
TREE_STATES = ("busy", "stopped")
SANDBOX_OUTCOMES = ("ok", "failed", "timeout", "error")
ROOM_LIMITS = ("engine", "scope")


def exported_names() -> frozenset[str]:
    """Every sample name on ``/metrics`` (Ray's export has the same with a ``ray_`` prefix)."""
    return frozenset(sample for metric in METRICS for sample in metric.samples())


def bounded(value: str, allowed: Iterable[str]) -> str:
    """``value`` when it is one of ``allowed``, else ``other``: label values stay a bounded set."""
    return value if value in allowed else OTHER


def sandbox_outcome(result: Any) -> str:
    """A command's outcome from its stored result: ok (exit 0), failed, timeout, or error (it did
    not run, or how it ended is unknown)."""
    if not isinstance(result, dict) or not isinstance(result.get("exit_code"), int):
        return "error"
    if result.get("timed_out"):
        return "timeout"
    return "ok" if result["exit_code"] == 0 else "failed"


class ModelLabels:
    """Model label values: the default model, the operator's own models (the models file's names,
    a list the operator bounds) and the first ``MAX_MODEL_LABELS`` others counted (those already
    in the table, then new ones as they come); any further model is ``other``, so the names a
    tenant's agents make up never take an operator's model's label away."""

    def __init__(self, default_model: str) -> None:
        self._known = {default_model}
        self._limit = MAX_MODEL_LABELS + 1
        self.seeded = False

    def seed(self, models: Iterable[str]) -> None:
        for model in models:
            if model != OTHER and len(self._known) < self._limit:
                self._known.add(model)
        self.seeded = True

    def label(self, model: str, own: Collection[str] = ()) -> str:
        """``own``: the operator's models, each its own label wherever the others stand."""
        if model in own:
            return model
        # Until the labels already counted are read (a database down at the first flush), a new
        # model is other: it must not take the place of one counted before.
        if model not in self._known and self.seeded and len(self._known) < self._limit:
            self._known.add(model)
        return model if model in self._known else OTHER


# -- recording ---------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]
Mirror = Callable[[Metric, dict[str, str], float], None]
_mirrors: list[Mirror] = []


def on_record(mirror: Mirror) -> None:
    """Also hand every recorded count and observation to ``mirror`` (actors/metrics.py: Ray's export)."""
    if mirror not in _mirrors:
        _mirrors.append(mirror)


def _labels(metric: Metric, labels: dict[str, str]) -> dict[str, str]:
    if tuple(labels) != metric.labels:
        raise ValueError(f"{metric.name} takes labels {metric.labels}, got {tuple(labels)}")
    return {key: str(value) for key, value in labels.items()}


class _Buffer:
    """This process's counts not yet in the table: (row name, labels) → amount."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, Labels], float] = {}
        self._flusher: asyncio.Task[None] | None = None
        # The pool of the latest commit: a process may open and close several over its life (a
        # one-off pool of an operator command beside the runtime's, a test's), so a flush uses the
        # newest rather than the one that scheduled it, which may have closed since.
        self._db: Database | None = None
        # The flush whose counts are taken but not yet committed: a flush asked for meanwhile (a
        # closing pool's last) waits for it, or it would find nothing pending and return before them.
        self._in_flight: asyncio.Future[None] | None = None

    def add(self, name: str, labels: dict[str, str], amount: float) -> None:
        key = (name, tuple(labels.items()))
        self.pending[key] = self.pending.get(key, 0.0) + amount
        # A count made after the process's last commit (a sandbox command counted once its receipt
        # is in) is flushed all the same, with the pool of that commit, not when a next one comes.
        if self._db is not None:
            self.flush_soon(self._db)

    def flush_soon(self, db: Database) -> None:
        self._db = db
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop (a synchronous caller): the next transaction schedules it
            return
        # A flush pending on another loop (one that may have stopped) does not count.
        if self._flusher is not None and not self._flusher.done() and self._flusher.get_loop() is loop:
            return
        self._flusher = loop.create_task(self._flush_later())

    def forget(self, db: Database) -> None:
        if self._db is db:
            self._db = None

    async def _flush_later(self) -> None:
        # Counts made while a flush runs are flushed by this task too: the flush's own commit cannot
        # schedule them (this task is still running), and the process may commit nothing else — which
        # is also why a failed flush (a busy database) is retried here, later each time, not left to a
        # next commit that may never come.
        delay = FLUSH_SECONDS
        while self.pending:
            await asyncio.sleep(delay)
            db = self._db
            if db is None:  # no open pool: the next commit brings one; look again soon, nothing failed
                delay = FLUSH_SECONDS
                continue
            delay = FLUSH_SECONDS if await self.flush(db) else min(delay * 2, _MAX_RETRY_SECONDS)

    async def flush(self, db: Database) -> bool:
        """Add the pending counts to the table in one statement; on failure they stay pending (False)."""
        from persistence.db import query

        loop = asyncio.get_running_loop()
        while self._in_flight is not None and not self._in_flight.done() and self._in_flight.get_loop() is loop:
            await asyncio.shield(self._in_flight)  # its counts are in the table, or pending again
        if not self.pending:
            return True
        taken, self.pending = self.pending, {}
        self._in_flight = in_flight = loop.create_future()
        # In one order everywhere: two processes flushing at once lock the rows they share in the
        # same order, so they never deadlock.
        ordered = sorted(taken.items())
        try:
            async with db.tx() as conn:
                await conn.execute(query("metric_counters_add"), {
                    "names": [name for (name, _), _ in ordered],
                    "labels": [Jsonb(dict(labels)) for (_, labels), _ in ordered],
                    "amounts": [amount for _, amount in ordered]})
        except Exception:
            log.warning("adding %d counts to metric_counters failed; they stay pending", len(ordered), exc_info=True)
            for key, amount in taken.items():
                self.pending[key] = self.pending.get(key, 0.0) + amount
            return False
        finally:
            in_flight.set_result(None)
        return True


_buffer = _Buffer()


def flush_soon(db: Database) -> None:
    """Called by ``Database.tx`` after each commit: schedule this process's counts for the table."""
    if _buffer.pending:
        _buffer.flush_soon(db)


async def flush_and_forget(db: Database) -> bool:
    """Add this process's pending counts to the table now through ``db``, which is closing: later
    flushes use another pool (a process that stops, or a hosted session that passivates)."""
    _buffer.forget(db)
    return await _buffer.flush(db)


async def flush(db: Database) -> bool:
    """Add this process's pending counts to the table now."""
    return await _buffer.flush(db)


def add(metric: Metric, amount: float = 1.0, **labels: str) -> None:
    """Count ``amount`` of a counter now (the table gets it within ``FLUSH_SECONDS``)."""
    if metric.kind != "counter":
        raise ValueError(f"{metric.name} is a {metric.kind}")
    values = _labels(metric, labels)
    if amount <= 0:
        return
    _buffer.add(metric.name, values, amount)
    for mirror in _mirrors:
        mirror(metric, values, amount)


def observe(metric: Metric, value: float, **labels: str) -> None:
    """One observation of a histogram: its bucket, its sum and its count."""
    if metric.kind != "histogram":
        raise ValueError(f"{metric.name} is a {metric.kind}")
    values = _labels(metric, labels)
    bucket = next((bound for bound in metric.buckets if value <= bound), None)
    _buffer.add(f"{metric.name}_bucket", {**values, "le": "+Inf" if bucket is None else f"{bucket:g}"}, 1.0)
    _buffer.add(f"{metric.name}_sum", values, max(0.0, value))
    _buffer.add(f"{metric.name}_count", values, 1.0)
    for mirror in _mirrors:
        mirror(metric, values, value)


class _AtCommit:
    """A count that happens once its transaction has committed (a ``Database.tx`` deferred): a
    change rolled back — the transaction's, a savepoint's around it, or a failed commit — is not
    counted."""

    def __init__(self, record: Callable[[], None]) -> None:
        self._record = record

    async def run(self, conn: Connection) -> None:
        """Nothing to write before the commit."""

    def committed(self) -> None:
        self._record()

    def mark(self) -> int:
        return 0

    def undo(self, mark: int) -> None:
        """A savepoint that rolls back drops this object from the queue itself; nothing to forget."""


def at_commit(conn: Connection, record: Callable[[], None]) -> None:
    """Run ``record`` (a count, a log line) when the ``Database.tx`` block of ``conn`` commits, or
    now when ``conn`` is in no such block."""
    from persistence.db import queued_last

    queued = queued_last(conn)
    if queued is None:
        record()
    else:
        queued.append(_AtCommit(record))


def count_at_commit(conn: Connection, metric: Metric, amount: float = 1.0, **labels: str) -> None:
    at_commit(conn, lambda: add(metric, amount, **labels))


def observe_at_commit(conn: Connection, metric: Metric, value: float, **labels: str) -> None:
    at_commit(conn, lambda: observe(metric, value, **labels))


# -- reading (the scrape) ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Figures:
    """What a scrape reads: the counter rows and the state gauges."""

    counters: list[dict[str, Any]]
    gauges: dict[str, Any]


async def read_gauges(conn: Connection) -> dict[str, Any]:
    """The state gauges, each answered by a partial index (see the module docstring)."""
    from persistence.db import query

    await conn.execute(query("metric_scrape_guard"))
    cur = await conn.execute(query("metric_gauges"))
    row = await cur.fetchone()
    assert row is not None
    return row


def open_turns(gauges: dict[str, Any]) -> dict[tuple[str, str], int]:
    """Open Turns per (status, waiting_for) from ``read_gauges``, every series of the fixed set
    present (0 when it has none)."""
    counts = dict.fromkeys(OPEN_TURN_SERIES, 0)
    for row in gauges["turns"]:
        key = (row["status"], row["waiting_for"])
        counts[key] = counts.get(key, 0) + row["n"]
    return counts


async def read(conn: Connection) -> Figures:
    """Everything ``/metrics`` shows, whole-cluster, in three statements whatever the tables hold."""
    from persistence.db import query

    gauges = await read_gauges(conn)
    cur = await conn.execute(query("metric_counters_read"))
    return Figures(await cur.fetchall(), gauges)


async def known_label_values(conn: Connection, metric: Metric, label: str) -> list[str]:
    """The values one label of a counter already has in the table (to seed ``ModelLabels``)."""
    from persistence.db import query

    cur = await conn.execute(query("metric_label_values"), {"name": metric.name, "label": label})
    return [row["value"] for row in await cur.fetchall()]
