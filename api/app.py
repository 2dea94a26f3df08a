"""The FastAPI application: ``create_app(runtime)`` builds the whole HTTP API (SPEC §11).

The same app runs under Ray Serve (api/serve_app.py, one Runtime per replica, started at
startup) and under plain uvicorn (tests, embedding: pass a running Runtime, which the app
uses and leaves running).

Decisions where the SPEC is silent:

- Lists (agents, projects, sessions, messages, requests) are bare JSON arrays.
- ``GET /sessions``: ``scope=all`` (the default) lists every root of the caller's scope;
  ``project_id`` filters (404 when it is not the caller's); ``scope=project`` without one
  means the caller's first project. Archived trees only with ``include_archived=true``.
- ``/healthz`` needs no key (probes have none); ``/metrics`` needs the metrics token
  (``CANOPY_METRICS_TOKEN``) or the admin token as the bearer. Both are served at the root
  and under ``/api/v1``.
- The admin token authorises only ``/admin`` (and ``/metrics``); an API key never authorises
  admin routes. API keys are accepted only in the Authorization header (api/auth.py).
- An API key holds at most ``CANOPY_MAX_STREAMS_PER_KEY`` open event streams across all
  replicas; one more answers 429 (api/sse.py).
- Validation errors are ``{"detail": "<one sentence>", "errors": [{loc, msg, type}]}``, so
  every error's ``detail`` is a string.
- Human inputs: ``POST /sessions/{id}/inputs`` takes ``origin`` ``human`` (default: unpauses
  a stopped member and tells its parent) or ``api``. Cancelling a finished Turn is a 202 no-op.
- A project's workdir is derived under the data directory; a caller never names a host path.
- Event streams start at cursor 0 without ``?after`` / ``Last-Event-ID`` (the header wins:
  a reconnecting EventSource keeps its URL); ``?after=latest`` streams only what commits from
  the moment the stream opens. ``GET /trees/{id}`` carries ``event_cursor``, read before the
  members, so a client that streams ``?after=<event_cursor>`` misses nothing the summary did
  not show. See api/sse.py and api/writes.py.
- ``GET /sessions`` entries carry ``attention``: their tree's member counts per state (one
  grouped query for the whole page). ``GET /sessions/{id}/inputs`` lists a session's inputs in
  queue order, texts cut to a preview (``?status=pending``: the ones a human may still cancel).
- ``GET /trees/{id}/timeline`` pages by an opaque cursor passed back as ``since`` (which also
  takes an ISO time: what changed after it); ``GET /trees/{id}/trace`` is the whole timeline as
  Chrome trace-event JSON (api/trace.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from actors.runtime import Runtime
from api import __version__, errors, reference, ui
from api.auth import KeyCache, require_scope
from api.headers import SecurityHeaders
from api.hub import EventHub
from api.limits import BodyLimit, KeyShare
from api.routes import (
    admin,
    agents,
    events,
    health,
    inputs,
    me,
    projects,
    requests,
    schedules,
    sessions,
    timeline,
    trees,
)
from api.schemas import ValidationErrorBody
from api.sse import StreamSettings
from persistence.settings import Settings, get_settings, reveal

API_PREFIX = "/api/v1"
DESCRIPTION = """Cooperating LLM sessions on Ray and PostgreSQL.

Authenticate with `Authorization: Bearer <api key>`; a key maps to one scope (user, app) and
another scope's objects answer 404. Errors are `{"detail": "..."}`. POST writes accept an
optional `Idempotency-Key` header."""


def _api_router() -> APIRouter:
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(admin.router)
    # Every other /api/v1 route needs an API key: one dependency here, so none can forget it.
    scoped = APIRouter(dependencies=[Depends(require_scope)])
    for module in (me, agents, projects, sessions, schedules, inputs, trees, timeline, requests, events):
        scoped.include_router(module.router)
    api.include_router(scoped)
    api.include_router(health.build_router("api_v1_"))  # /api/v1/healthz and /api/v1/metrics too
    return api


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with validation errors described as we actually send them."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["HTTPValidationError"] = ValidationErrorBody.model_json_schema(
            ref_template="#/components/schemas/{model}")
        components.pop("ValidationError", None)
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(
    runtime: Runtime | None = None,
    *,
    settings: Settings | None = None,
    admin_token: str | None = None,
    metrics_token: str | None = None,
    stream_settings: StreamSettings | None = None,
) -> FastAPI:
    """The HTTP API.

    ``runtime``: a started Runtime to use (and leave running); None starts one at startup
    with ``settings`` and closes it at shutdown (a Serve replica). The app's own settings (the
    body's deadline) are ``settings``, else the runtime's, else the environment's. ``admin_token`` and
    ``metrics_token``: default to the settings' ``CANOPY_ADMIN_TOKEN`` and
    ``CANOPY_METRICS_TOKEN``; without them the routes they guard always answer 401.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A request waits a few seconds for a connection, then is told to come back (api/errors.py).
        # The pool's size is a setting of its own, not CANOPY_DB_POOL_MAX in the replica's environment:
        # Ray hands a process's runtime_env down to every actor it makes (a session host's pool is
        # sized by that setting), and a replica makes the sweeper and the hosts of a Serve deployment.
        chosen = settings or get_settings()
        active = runtime or await Runtime.start(chosen, db_wait_seconds=chosen.api_db_wait_seconds,
                                                db_pool_max=chosen.api_db_pool_max)
        key_cache = KeyCache(listening=lambda: hub.listening)
        hub = EventHub(active.database_url, on_keys_changed=key_cache.forget)
        await hub.start()
        app.state.runtime = active
        app.state.hub = hub
        app.state.key_cache = key_cache
        app.state.admin_token = admin_token if admin_token is not None else reveal(active.settings.admin_token)
        app.state.metrics_token = metrics_token if metrics_token is not None else reveal(
            active.settings.metrics_token)
        app.state.stream_settings = stream_settings or StreamSettings()
        try:
            yield
        finally:
            await hub.stop()
            if runtime is None:
                await active.close()

    app = FastAPI(title="Canopy", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  # Operation ids are the handler names (all unique): readable client method names.
                  generate_unique_id_function=lambda route: route.name,
                  docs_url=None, redoc_url=None)  # api/reference.py: the same pages, scripts pinned
    errors.install(app)
    chosen = settings or (runtime.settings if runtime is not None else get_settings())
    app.add_middleware(KeyShare, concurrency=chosen.api_key_concurrency, wait_seconds=chosen.api_db_wait_seconds)
    app.add_middleware(BodyLimit, body_seconds=chosen.api_body_seconds)
    app.add_middleware(SecurityHeaders)
    app.include_router(_api_router())
    app.include_router(health.build_router())
    reference.install(app)
    ui.install(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
