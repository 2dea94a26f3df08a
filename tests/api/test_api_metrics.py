"""``/metrics`` over real HTTP: whole-cluster figures during a fan-out without scanning a table, the
same names in Ray's export, bounded model labels, and a Grafana dashboard that names only them."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from api.app import create_app
from persistence import metrics
from persistence.db import Database, query
from tests.actors.helpers import model_gateway, ray_prometheus_text
from tests.api.conftest import TEST_STREAMS, ApiServer, uvicorn_server
from tests.api.helpers import ADMIN_TOKEN, client, poll, seq_scans, terminal

DASHBOARD = Path(__file__).resolve().parents[2] / "api" / "grafana" / "canopy.json"
CHILDREN = 12
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class _RecordingCursor(psycopg.AsyncCursor[Any]):
    """A cursor that notes every statement it executes (a scrape's connection pool uses it)."""

    statements: ClassVar[list[str]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        _RecordingCursor.statements.append(str(query))
        return await super().execute(query, params, **kwargs)


@pytest.fixture
async def scraped_api(runtime: Runtime) -> AsyncIterator[ApiServer]:
    """An API replica whose database connections note every statement they run."""
    pool = AsyncConnectionPool(runtime.database_url, min_size=1, max_size=2, open=False, kwargs={
        "row_factory": dict_row, "autocommit": False, "prepare_threshold": 0, "cursor_factory": _RecordingCursor})
    await pool.open(wait=True)
    replica = Runtime(Database(pool), runtime.settings, runtime.database_url)
    async with uvicorn_server(create_app(replica, admin_token=ADMIN_TOKEN, stream_settings=TEST_STREAMS)) as server:
        yield server
    await pool.close()


def _samples(text: str) -> Samples:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, found), value in samples.items() if sample == name and wanted <= found)


async def _scrape(http: httpx.AsyncClient) -> tuple[Samples, list[str]]:
    """One scrape, parsed, with the statements it ran (the process's own counter flush, which a
    scrape's commit may schedule, is not the scrape's work and is left out)."""
    _RecordingCursor.statements.clear()
    response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    flush = query("metric_counters_add")
    return _samples(response.text), [s for s in _RecordingCursor.statements if s != flush]


async def test_scrapes_during_a_fan_out_are_whole_cluster_and_scan_no_table(
        scraped_api: ApiServer, http: httpx.AsyncClient, runtime: Runtime) -> None:
    async with client(scraped_api.url, ADMIN_TOKEN) as scraper:
        before, _ = await _scrape(scraper)
        # c0 outlasts the root's next step by far, so its wait parks (on a loaded machine that step
        # once took longer than all the 500 ms children together).
        text = script(
            call(*(create(f"c{i}", script(say(f"c{i} done", delay_ms=5000 if i == 0 else 500)))
                   for i in range(CHILDREN))),
            call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(CHILDREN)]})),
            say("fan-out done"))
        created = (await http.post("/api/v1/sessions", json={"input": text})).json()
        during: list[Samples] = []
        statements: list[list[str]] = []
        while not await terminal(http, created["input"]["input_id"]):
            samples, ran = await _scrape(scraper)
            during.append(samples)
            statements.append(ran)
            await asyncio.sleep(0.2)
        result = (await http.get(f"/api/v1/inputs/{created['input']['input_id']}/result")).json()
        assert result["output"] == "fan-out done"

        # Counts reach the table within a second or two of their commit: then every one is there.
        model_calls = CHILDREN + 3  # a call per child; the root's create step, wait step and answer
        expected = {("canopy_model_calls_total", "outcome", "ok"): model_calls,
                    ("canopy_turns_ended_total", "status", "completed"): CHILDREN + 1,
                    ("canopy_turns_started_total", "", ""): CHILDREN + 1,
                    ("canopy_tool_calls_total", "tool", "create_session"): CHILDREN,
                    ("canopy_sessions_created_total", "", ""): CHILDREN + 1,
                    ("canopy_slot_wait_seconds_count", "", ""): CHILDREN + 1}

        async def counted() -> Samples | None:
            samples, ran = await _scrape(scraper)
            statements.append(ran)
            for (name, label, value), least in expected.items():
                labels = {label: value} if label else {}
                if _value(samples, name, **labels) - _value(before, name, **labels) < least:
                    return None
            return samples

        after = await poll(counted, timeout=30)

    assert len(during) >= 3, "the fan-out outlasted several scrapes"
    slots = [_value(samples, "canopy_slots_in_use") for samples in during]
    assert max(slots) >= 1 and max(slots) <= 4, slots  # the tree's 4 slots, never more
    assert max(_value(s, "canopy_turns", status="running") for s in during) >= 1

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("canopy_model_latency_seconds_count", model="canopy/scripted") >= model_calls
    assert grew("canopy_model_latency_seconds_bucket", model="canopy/scripted", le="0.25") <= grew(
        "canopy_model_latency_seconds_bucket", model="canopy/scripted", le="1")  # cumulative buckets
    assert grew("canopy_model_tokens_total", model="canopy/scripted", kind="prompt") > 0
    assert grew("canopy_tool_calls_total", tool="create_session", outcome="ok") >= CHILDREN
    assert grew("canopy_tool_calls_total", tool="wait_inputs", outcome="parked") >= 1
    assert grew("canopy_trees_created_total") >= 1
    assert _value(after, "canopy_slots_in_use") == 0

    # Every scrape ran the same three statements, whatever the tables held meanwhile...
    expected = [query("metric_scrape_guard"), query("metric_gauges"), query("metric_counters_read")]
    assert all(ran == expected for ran in statements), {tuple(s[:40] for s in ran) for ran in statements}
    # ...and, run as the scrape runs them, they scan no table: their plans have no sequential scan
    # and PostgreSQL's own count of the table accesses of a new session that ran them has none either
    # (a new session: a pooled one's counts may still hold its earlier transactions').
    async with await psycopg.AsyncConnection.connect(runtime.database_url, row_factory=dict_row) as conn:
        await conn.execute(expected[0])
        for statement in expected[1:]:
            cur = await conn.execute("EXPLAIN (FORMAT JSON) " + statement)  # type: ignore[operator]
            plan = (await cur.fetchone())["QUERY PLAN"][0]["Plan"]  # type: ignore[index]
            assert seq_scans(plan) == [], (statement, seq_scans(plan))
            await conn.execute(statement)
        cur = await conn.execute("SELECT relname, seq_scan, idx_scan FROM pg_stat_xact_user_tables "
                                 "WHERE seq_scan > 0 OR idx_scan > 0")
        accessed = {row["relname"]: row for row in await cur.fetchall()}
    assert {name for name, row in accessed.items() if row["seq_scan"]} == set(), accessed
    assert {"runs", "inputs", "requests", "turns", "trees", "metric_counters"} <= accessed.keys()

    # The same names in Ray's export, with Ray's prefix: every gauge (published by the sweeper) and
    # every counter and histogram that counted during this fan-out (the table also holds what processes
    # of an earlier Ray on the same database counted, which this Ray never exported).
    names = {name for (name, labels), value in after.items() if value > before.get((name, labels), 0.0)}
    names |= {sample for metric in metrics.METRICS if metric.kind == "gauge" for sample in metric.samples()}

    async def in_ray() -> set[str] | None:
        text = await asyncio.to_thread(ray_prometheus_text)
        found = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
        missing = {f"ray_{name}" for name in names} - found
        return None if missing else found

    try:
        await poll(in_ray, timeout=60)
    except TimeoutError:
        text = await asyncio.to_thread(ray_prometheus_text)
        found = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
        raise AssertionError(sorted({f"ray_{name}" for name in names} - found)) from None


async def test_model_labels_are_bounded(api: ApiServer, runtime: Runtime) -> None:
    """Any model string a user writes reaches the gateway; past the bounded set it is counted as other."""
    gateway = model_gateway()
    spread = metrics.MAX_MODEL_LABELS + 5
    prefix = f"canopy/labels-{uuid.uuid4().hex[:8]}"
    messages = [{"role": "user", "content": script(say("ok"))}]
    await asyncio.gather(*(gateway.complete_for_run.remote(call_id=uuid.uuid4().hex, run_id=str(uuid.uuid4()),
                                                           model=f"{prefix}-{i}", messages=messages, tools=None)
                           for i in range(spread)))
    async with client(api.url, ADMIN_TOKEN) as admin:

        async def scraped() -> Samples | None:
            samples = _samples((await admin.get("/metrics")).text)
            named = sum(_value(samples, "canopy_model_calls_total", model=f"{prefix}-{i}") for i in range(spread))
            return samples if named + _value(samples, "canopy_model_calls_total", model="other") >= spread else None

        samples = await poll(scraped, timeout=30)
    models = {dict(labels)["model"] for name, labels in samples if name == "canopy_model_calls_total"}
    assert len(models) <= metrics.MAX_MODEL_LABELS + 2, sorted(models)  # the default, the first N, other
    # The calls end in any order: which of them got a label of their own is not fixed, how many is.
    assert metrics.OTHER in models and len({model for model in models if model.startswith(prefix)}) <= \
        metrics.MAX_MODEL_LABELS
    stored = await _label_values(runtime)
    assert len(stored) <= metrics.MAX_MODEL_LABELS + 2, stored  # the table stays as small


async def _label_values(runtime: Runtime) -> list[str]:
    async with runtime.db.tx() as conn:
        return await metrics.known_label_values(conn, metrics.MODEL_CALLS, "model")


# -- the Grafana dashboard --------------------------------------------------------------------------

# PromQL words that are not metric names: functions, aggregations, keywords, and label names after
# by/without/on/ignoring (handled below), plus durations and numbers (not matched as identifiers).
_PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "group", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "clamp_min",
    "clamp_max", "abs", "ceil", "floor", "round", "vector", "scalar", "time", "label_replace", "label_join",
    "sum_over_time", "avg_over_time", "max_over_time", "min_over_time", "last_over_time", "absent", "inf", "nan",
}


def _metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, grouping labels, strings,
    Grafana variables and range durations stripped first)."""
    text = re.sub(r"\$(\{\w+\}|\w+)", "", expression)  # Grafana variables (${metric_prefix}, ...)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # strings (label values)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)  # label lists
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {word for word in words if word not in _PROMQL_WORDS}


def _expressions(panel: dict[str, Any]) -> list[str]:
    found = [target["expr"] for target in panel.get("targets", []) if target.get("expr")]
    for child in panel.get("panels", []):
        found += _expressions(child)
    return found


def test_the_grafana_dashboard_names_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [expr for panel in dashboard["panels"] for expr in _expressions(panel)]
    assert len(expressions) >= 10
    exported = metrics.exported_names()
    allowed = exported | {f"ray_{name}" for name in exported}
    used: set[str] = set()
    for expression in expressions:
        names = _metric_names(expression)
        assert names, expression
        assert names <= allowed, (expression, sorted(names - allowed))
        used |= names
    titles = " ".join(panel.get("title", "").lower() for panel in dashboard["panels"])
    for topic in ("trees", "sessions", "slot", "queue", "latency", "tokens", "cost", "error", "recover"):
        assert topic in titles, topic
    # Every metric Canopy defines is on the dashboard (through /metrics or Ray's export).
    plain = {name.removeprefix("ray_") for name in used}
    assert [m.name for m in metrics.METRICS if not plain & set(m.samples())] == []
