"""Runtime figures for ``/metrics``, computed from the database so any API replica reports the truth.

These are global operator figures (all scopes), aggregated: no ids, no text.
"""

from __future__ import annotations

from typing import Any, LiteralString, cast

from persistence.db import Connection
from persistence.runs import LEASE_EXPIRED

# Model-call latency histogram bounds, in milliseconds (exported in seconds).
LATENCY_BUCKETS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)

_GAUGES = """
SELECT
    (SELECT count(*) FROM runs WHERE status = 'running') AS slots_in_use,
    (SELECT count(*) FROM runs WHERE status = 'pending') AS runs_queued,
    (SELECT count(*) FROM inputs WHERE status = 'pending') AS inputs_pending,
    (SELECT count(*) FROM requests WHERE status = 'pending') AS requests_pending,
    (SELECT count(*) FROM trees WHERE stopped) AS trees_stopped,
    (SELECT count(*) FROM sessions) AS sessions,
    (SELECT count(*) FROM runs WHERE error = %(lease_expired)s) AS recoveries
"""
_TURNS = "SELECT status, coalesce(waiting_for, '') AS waiting_for, count(*) AS n FROM turns GROUP BY 1, 2"
_RUNS = "SELECT status, count(*) AS n FROM runs GROUP BY 1"


def _model_calls_sql() -> LiteralString:
    buckets = ", ".join(f"count(*) FILTER (WHERE latency_ms <= {bound}) AS le_{bound}" for bound in LATENCY_BUCKETS_MS)
    return cast(LiteralString, f"""
SELECT model, count(*) AS calls, count(error) AS errors, coalesce(sum(latency_ms), 0) AS latency_ms_sum,
       coalesce(sum(prompt_tokens), 0) AS prompt_tokens, coalesce(sum(completion_tokens), 0) AS completion_tokens,
       coalesce(sum(cost_usd), 0) AS cost_usd, {buckets}
FROM model_calls GROUP BY model ORDER BY model
""")


async def runtime_metrics(conn: Connection) -> dict[str, Any]:
    cur = await conn.execute(_GAUGES, {"lease_expired": LEASE_EXPIRED})
    gauges = await cur.fetchone()
    assert gauges is not None
    cur = await conn.execute(_TURNS)
    turns = await cur.fetchall()
    cur = await conn.execute(_RUNS)
    runs = await cur.fetchall()
    cur = await conn.execute(_model_calls_sql())  # built from constants only
    models = await cur.fetchall()
    return {**gauges, "turns": turns, "runs": runs, "models": models}
