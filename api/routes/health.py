"""Operator endpoints without an API key: liveness (open to any probe) and Prometheus metrics
(the metrics token or the admin token as the bearer: a scraper is configured with one)."""

from __future__ import annotations

import asyncio
import weakref

import ray
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from actors.naming import NAMESPACE, SWEEPER_NAME
from actors.runtime import Runtime
from api import metrics
from api.auth import require_metrics_reader
from api.deps import RuntimeDep, errors
from api.schemas import Health
from persistence import metrics as figures
from persistence.db import ping


def _ray_reachable() -> str:
    if not ray.is_initialized():
        return "not connected"
    ray.get_actor(SWEEPER_NAME, namespace=NAMESPACE)  # a GCS round trip (the one sweeper of the cluster)
    return "ok"


# The check in flight, per runtime. Probes need no key: many at once share one check, so that they
# hold neither the database pool's connections nor the default executor's few threads (which
# actor lookups use too) while Ray or the database is slow.
_checking: weakref.WeakKeyDictionary[Runtime, asyncio.Future[Health]] = weakref.WeakKeyDictionary()


async def healthz(runtime: RuntimeDep) -> JSONResponse:
    """Liveness, plus database and Ray reachability (503 when either is unreachable)."""
    check = _checking.get(runtime)
    if check is None or check.done():
        check = _checking[runtime] = asyncio.ensure_future(_check(runtime))
    body = await asyncio.shield(check)  # a probe that goes away leaves the check to the others
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)


async def _check(runtime: Runtime) -> Health:
    try:
        async with runtime.db.tx() as conn:
            await ping(conn)
        database = "ok"
    except Exception as error:
        database = f"unreachable: {type(error).__name__}"
    try:
        ray_state = await asyncio.wait_for(asyncio.to_thread(_ray_reachable), timeout=5)
    except Exception as error:
        ray_state = f"unreachable: {type(error).__name__}"
    healthy = database == "ok" and ray_state == "ok"
    return Health(status="ok" if healthy else "degraded", database=database, ray=ray_state)


async def prometheus_metrics(runtime: RuntimeDep) -> Response:
    """Canopy's metrics, whole-cluster: counters kept as things happen, state gauges read through
    partial indexes (persistence/metrics.py); no table is scanned."""
    async with runtime.db.tx() as conn:
        read = await figures.read(conn)
    return Response(metrics.render(read), media_type=metrics.CONTENT_TYPE)


def build_router(operation_prefix: str = "") -> APIRouter:
    """The two routes, mountable twice (at ``/`` and under ``/api/v1``) with distinct operation ids."""
    router = APIRouter(tags=["operations"])
    router.add_api_route("/healthz", healthz, methods=["GET"], response_model=Health,
                         operation_id=f"{operation_prefix}healthz",
                         responses={503: {"model": Health, "description": "Degraded."}})
    router.add_api_route("/metrics", prometheus_metrics, methods=["GET"], response_class=PlainTextResponse,
                         operation_id=f"{operation_prefix}metrics", dependencies=[Depends(require_metrics_reader)],
                         responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                          "description": "Prometheus text format 0.0.4."}, **errors(401)})
    return router
