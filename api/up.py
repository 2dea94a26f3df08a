"""``canopy up``: a whole local runtime in one command, stopped cleanly on Ctrl-C / SIGTERM.

With no configuration it starts what it needs and remembers what it started: the embedded
PostgreSQL (under the data dir), a local Ray with its dashboard, and the Serve application
(API + UI, the Runtime, gateway and sweeper inside). On exit it stops exactly those: Serve,
Ray (which takes every Ray worker with it) and the embedded database. With
``CANOPY_DATABASE_URL`` / ``CANOPY_RAY_ADDRESS`` it joins that infrastructure instead and,
on exit, only removes its Serve application.

Only the API listens beyond loopback, even with ``--host 0.0.0.0``: the embedded PostgreSQL
has no TCP socket at all, and a Ray started here has loopback as its node address, so its
GCS, raylet, object manager, workers, dashboard, dashboard agent, runtime-env agent and
metrics exporters bind 127.0.0.1 (Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set by
the ``canopy`` command before anything imports Ray, as "this node is its own cluster"; a
Ray started here with another node address is refused before anything serves), and
Serve replicas bind their internal gRPC server to loopback (api/serve_app.py). A Ray head
node is a code-execution service (job submission): even with Ray's token authentication it
should not face a network it does not need, so only ``--expose-ray`` (with a warning) gives
Ray the machine's address and the dashboard the ``--host``.

Secrets: the admin token (generated unless ``CANOPY_ADMIN_TOKEN`` is set) and the database
URL reach Ray's processes only as files (actors/runtime.py); the generated token is printed
once, with the API key of the default scope the SPEC asks for, and nothing else secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
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
from pydantic import SecretStr
from ray import serve

from actors.runtime import Runtime, init_ray, worker_env
from api.serve_app import APP_NAME, LOOPBACK, application
from persistence.db import resolve_database_url
from persistence.embedded import stop_embedded
from persistence.errors import CanopyError
from persistence.migrations import ensure_schema
from persistence.records import Scope
from persistence.settings import Settings, get_settings, reveal
from sandbox.manager import backend_warning

log = logging.getLogger(__name__)
DEFAULT_SCOPE = Scope("local", "canopy")


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


def _init_ray(settings: Settings, database_url: str, host: str, dashboard_port: int,
              expose_ray: bool) -> dict[str, Any]:
    if settings.ray_address:
        context = init_ray(settings, database_url, logging_level=logging.WARNING)
        return {"dashboard_url": context.dashboard_url}
    context = init_ray(settings, database_url, logging_level=logging.WARNING, include_dashboard=True,
                       dashboard_host=host if expose_ray else LOOPBACK, dashboard_port=dashboard_port,
                       _node_ip_address=None if expose_ray else LOOPBACK)
    node_address = ray.util.get_node_ip_address()
    if not expose_ray and not ipaddress.ip_address(node_address).is_loopback:
        raise CanopyError(f"Ray started with the node address {node_address}, so it would listen beyond loopback: "
                           "Ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set (run `canopy up`, "
                           "or set it in the environment); use --expose-ray to open Ray on purpose")
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
       replicas: int = 1, expose_ray: bool = False) -> int:
    if not _port_free(host, port):
        # Checked first: Serve would otherwise keep retrying its proxy on a taken port.
        print(f"canopy: {host}:{port} is already in use; choose another with --port", file=sys.stderr)
        return 2
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1" if expose_ray else "0")
    if data_dir is not None:
        os.environ["CANOPY_DATA_DIR"] = str(data_dir)
    get_settings.cache_clear()
    settings = get_settings()
    generated_token = settings.admin_token is None
    if generated_token:  # kept in this process and the secrets directory, never in an environment
        settings = settings.model_copy(update={"admin_token": SecretStr("adm_" + secrets.token_urlsafe(24))})
    if expose_ray and settings.ray_address is None:
        print(f"canopy: WARNING: --expose-ray: Ray (GCS, raylet, workers, agents) listens on this machine's "
              f"address and its dashboard on {host}; whoever reaches them with the cluster's Ray token "
              "(~/.ray/auth_token) can run code here", file=sys.stderr, flush=True)
    sandbox_warning = backend_warning(settings)
    if sandbox_warning:
        print(f"canopy: {sandbox_warning}", file=sys.stderr, flush=True)
    started = Started()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # until the service loop below takes over
    try:
        if settings.database_url is None and not _embedded_pg_running(settings.data_dir):
            started.embedded_pg = settings.data_dir
        database_url = resolve_database_url(settings)
        ensure_schema(database_url)
        started.local_ray = settings.ray_address is None
        ray_info = _init_ray(settings, database_url, host, dashboard_port, expose_ray)
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
    token = reveal(settings.admin_token) if generated_token else "(from CANOPY_ADMIN_TOKEN)"
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
