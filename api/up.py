"""``canopy up``: a whole local runtime in one command, stopped cleanly on Ctrl-C / SIGTERM.

With no configuration it starts what it needs and remembers what it started: the embedded
PostgreSQL (under the data dir), a local Ray with its dashboard (loopback only: Ray has no
authentication of its own), and the Serve application (API + UI, the Runtime, gateway and
sweeper inside). On exit it stops exactly those: Serve, Ray (which takes every Ray worker
with it) and the embedded database. With ``CANOPY_DATABASE_URL`` / ``CANOPY_RAY_ADDRESS``
it joins that infrastructure instead and, on exit, only removes its Serve application.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import ray
from ray import serve

from actors.runtime import Runtime, init_ray, worker_env
from api.serve_app import APP_NAME, application
from persistence.db import resolve_database_url
from persistence.embedded import stop_embedded
from persistence.migrations import ensure_schema
from persistence.records import Scope
from persistence.settings import Settings, get_settings

log = logging.getLogger(__name__)
DEFAULT_SCOPE = Scope("local", "canopy")
LOOPBACK = "127.0.0.1"


@dataclasses.dataclass
class Started:
    """What this process started, so that it stops exactly that."""

    embedded_pg: Path | None = None
    local_ray: bool = False
    serve_app: bool = False


def _embedded_pg_running(data_dir: Path) -> bool:
    return (data_dir.expanduser().resolve() / "pg" / "postmaster.pid").exists()


def _exit_on_sigterm(signum: int, _: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _init_ray(settings: Settings, database_url: str, host: str, dashboard_port: int) -> dict[str, Any]:
    if settings.ray_address:
        context = init_ray(settings, database_url, logging_level=logging.WARNING)
    else:
        # Ray's node address (GCS, raylet, object manager) and its dashboard stay on loopback
        # unless --host opens them.
        context = init_ray(settings, database_url, logging_level=logging.WARNING, include_dashboard=True,
                           dashboard_host=host, dashboard_port=dashboard_port,
                           _node_ip_address=LOOPBACK if host == LOOPBACK else None)
    return {"dashboard_url": context.dashboard_url}


async def _prepare(settings: Settings) -> str:
    """Start the detached gateway and sweeper, and mint an API key for the default scope."""
    runtime = await Runtime.start(settings)
    try:
        return await runtime.create_api_key(DEFAULT_SCOPE)
    finally:
        await runtime.close()


def _stop(started: Started) -> None:
    if started.serve_app:
        with contextlib.suppress(Exception):
            if started.local_ray:
                serve.shutdown()
            else:
                serve.delete(APP_NAME)
    if ray.is_initialized():
        with contextlib.suppress(Exception):
            ray.shutdown()  # for a local cluster this stops the head node: every Ray process of it
    if started.embedded_pg is not None:
        with contextlib.suppress(Exception):
            stop_embedded(started.embedded_pg)


def start_serve(env: dict[str, str], host: str, port: int, replicas: int = 1) -> None:
    """Serve's HTTP proxy on host:port with the Canopy application (API + UI) at ``/``, its
    replicas running with ``env``. Blocks until the application is ready."""
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    serve.run(application(env, num_replicas=replicas), name=APP_NAME, route_prefix="/")


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def up(host: str = LOOPBACK, port: int = 8000, data_dir: Path | None = None, dashboard_port: int = 8265,
       replicas: int = 1) -> int:
    if not _port_free(host, port):
        # Checked first: Serve would otherwise keep retrying its proxy on a taken port.
        print(f"canopy: {host}:{port} is already in use; choose another with --port", file=sys.stderr)
        return 2
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if data_dir is not None:
        os.environ["CANOPY_DATA_DIR"] = str(data_dir)
    generated_token = not os.environ.get("CANOPY_ADMIN_TOKEN")
    if generated_token:
        os.environ["CANOPY_ADMIN_TOKEN"] = "adm_" + secrets.token_urlsafe(24)
    get_settings.cache_clear()
    settings = get_settings()
    started = Started()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # until the service loop below takes over
    try:
        if settings.database_url is None and not _embedded_pg_running(settings.data_dir):
            started.embedded_pg = settings.data_dir
        database_url = resolve_database_url(settings)
        ensure_schema(database_url)
        started.local_ray = settings.ray_address is None
        ray_info = _init_ray(settings, database_url, host, dashboard_port)
        api_key = asyncio.run(_prepare(settings))
        started.serve_app = True
        start_serve(worker_env(settings, database_url), host, port, replicas)
        _announce(host, port, ray_info["dashboard_url"], api_key, settings, generated_token)
        _serve_until_signalled()
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        print("canopy: stopping…", flush=True)
        _stop(started)
        print("canopy: stopped", flush=True)


def _announce(host: str, port: int, dashboard: str | None, api_key: str, settings: Settings,
              generated_token: bool) -> None:
    base = f"http://{host}:{port}"
    # A token the operator chose is a secret they already have: only a generated one is shown.
    token = settings.admin_token if generated_token else "(from CANOPY_ADMIN_TOKEN)"
    lines = [
        "Canopy is up.",
        f"  API        {base}/api/v1   (reference: {base}/docs)",
        # The key rides in the fragment, which browsers never send: the UI stores it and scrubs the address.
        f"  UI         {base}/#key={api_key}",
        f"  Dashboard  {'http://' + dashboard if dashboard and '://' not in dashboard else dashboard or 'n/a'}",
        f"  API key    {api_key}   (scope {DEFAULT_SCOPE.user_id}/{DEFAULT_SCOPE.app_id})",
        f"  Admin      {token}" + ("   (generated; set CANOPY_ADMIN_TOKEN to choose one)" if generated_token else ""),
        f"  Data       {settings.data_dir}",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _serve_until_signalled() -> None:
    stop = threading.Event()

    def request_stop(signum: int, _: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    while not stop.wait(0.5):
        pass
