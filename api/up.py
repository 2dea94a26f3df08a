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
should not face a network it does not need, so only ``--expose-ray`` (with a warning, and
never with Ray's token authentication off) gives Ray the machine's address and the dashboard
the ``--host``.

It behaves like a server: one line per startup step (``database … ok (0.8 s)``) on stdout, a
clear one-line error and exit code 2 when it cannot start (a port in use, a database it
cannot reach), and no warning on a clean machine. One ``canopy up`` serves a data dir at a
time (a lock in the data dir); the record of what it started (``canopy-up.json``, no secrets)
outlives a crash, so the next one stops what the killed run left of its Ray session and
reuses its embedded PostgreSQL, and says so. Its ports are probed as the servers bind them
(``port_free``), so the connections a killed run left in TIME_WAIT do not block a restart.

Secrets: the admin token (generated unless ``CANOPY_ADMIN_TOKEN`` is set) and the database
URL reach Ray's processes only as files (actors/runtime.py); the generated token is printed
once, with the API key of the default scope the SPEC asks for, and nothing else secret. That
key is the run's own, as a notebook server's token is: a clean stop revokes it, and a run that
did not stop (or could not revoke it) has it revoked by the next ``canopy up`` on the data dir,
which knows it by its id (``canopy-up-keys.json``, recorded before the key is printed). Keys made
otherwise (the admin API, ``canopy keys create``) are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import ray
from pydantic import SecretStr
from ray import serve

from actors.ray_compat import serve_http_address
from actors.runtime import UP_LOCK, Runtime, init_ray, worker_env
from api import __version__
from api.operator import in_database
from api.serve_app import APP_NAME, LOOPBACK, application
from persistence import scopes
from persistence.db import resolve_database_url
from persistence.embedded import require_one_node, running_postmaster, stop_embedded
from persistence.errors import CanopyError, DatabaseUnreachable, RayUnreachable, SharedDatabaseRequired
from persistence.migrations import ensure_schema
from persistence.records import Scope
from persistence.settings import GENERATED_ADMIN_TOKEN_PREFIX, Settings, get_settings, reveal
from sandbox.manager import backend_warning

log = logging.getLogger(__name__)
DEFAULT_SCOPE = Scope("local", "canopy")
# A killed run's Serve proxy outlives it until it notices its raylet is gone (a few seconds):
# its ports are waited for this long before they count as taken.
PORT_GRACE_SECONDS = 20.0
_STOP_GRACE_SECONDS = 5.0


class StartupError(CanopyError):
    """``canopy up`` cannot start; the sentence says why and what to do."""


@dataclasses.dataclass
class Started:
    """What this process started, so that it stops exactly that (and, recorded in the data dir,
    so that the next run finds what a killed one left)."""

    embedded_pg: Path | None = None
    local_ray: bool = False
    serve_app: bool = False
    # Serve on a cluster it joined, which was not running there before (a local Ray takes its own).
    joined_serve: bool = False
    ray_session_dir: str | None = None


class RunRecord:
    """``<data dir>/canopy-up.lock``, locked (``flock``) while a ``canopy up`` serves the data
    dir (it holds that run's pid), and ``canopy-up.json``, what it started. The kernel drops the lock of a killed
    process, so a record found with the lock free was left by a run that never stopped.

    ``canopy-up-keys.json``: the ids of the API keys runs on the data dir minted (and printed)
    that are not known to be revoked; it outlives a clean stop, whose revocation may fail."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir.expanduser().resolve()
        self.path = self.directory / "canopy-up.json"
        self.keys_path = self.directory / "canopy-up-keys.json"
        self.minted_here = False
        self._lock: int | None = None
        self._saved = False

    def acquire(self) -> dict[str, Any] | None:
        """Lock the data dir; the record of a previous run that did not stop, if any."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / UP_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StartupError(f"another canopy up (pid {holder}) serves the data dir {self.directory}; stop it "
                               "first, or choose another with --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock = fd
        return self._read() or None

    def save(self, started: Started) -> None:
        record = {"pid": os.getpid(), "embedded_pg": started.embedded_pg is not None,
                  "ray_session_dir": started.ray_session_dir}
        _replace(self.path, json.dumps(record))
        self._saved = True

    def minted_keys(self) -> list[uuid.UUID]:
        try:
            return [uuid.UUID(key_id) for key_id in json.loads(self.keys_path.read_text())]
        except FileNotFoundError:
            return []
        except (TypeError, ValueError):  # it would take them out of sight for good: never passed over
            raise StartupError(f"{self.keys_path} is not a JSON list of key ids: revoke the keys earlier runs "
                               "printed (canopy keys list, canopy keys revoke) and remove it") from None

    def remember_key(self, key_id: uuid.UUID) -> None:
        """Before the key is printed: any key a run printed is revoked by a run to come."""
        _replace(self.keys_path, json.dumps([str(key) for key in [*self.minted_keys(), key_id]]))
        self.minted_here = True

    def forget_keys(self, revoked: set[uuid.UUID]) -> None:
        _replace(self.keys_path, json.dumps([str(key) for key in self.minted_keys() if key not in revoked]))

    def release(self) -> None:
        """Unlock; what this run recorded is stopped, so the record goes (a previous run's stays
        when this one started nothing, for the next run to find)."""
        if self._lock is not None:
            if self._saved:
                self.path.unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None

    def _read(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return {}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET


def hostport(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets (``[::]:8000``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def require_local_address(host: str) -> None:
    """A server can listen on ``host`` here: an address of this machine (or a wildcard). Checked
    apart from the ports, whose probe would take a foreign address for a port in use."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError as error:
            problem = ("is not an address of this machine" if error.errno == errno.EADDRNOTAVAIL
                       else f"cannot be listened on ({error.strerror})")
            raise StartupError(f"--host {host} {problem}: choose one of its own (127.0.0.1, ::1, 0.0.0.0, :: or "
                               "an address of one of its interfaces)") from None


def _replace(path: Path, text: str) -> None:
    """``path`` replaced whole (written aside, then renamed): a crash leaves the old file or the new one."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    aside.write_text(text)
    aside.replace(path)


async def _revoke_minted(record: RunRecord) -> int:
    """Revoke the keys canopy up runs on the data dir minted; how many the database has. Ids it does not
    have (minted while the data dir used another database) stay recorded, for when it does again."""
    minted = record.minted_keys()
    if not minted:
        return 0
    revoked = await in_database(lambda conn: scopes.revoke_keys(conn, minted))
    record.forget_keys({row["key_id"] for row in revoked})
    return len(revoked)


def _revoke_on_stop(record: RunRecord) -> None:
    """The key this run printed stops working with it; when it cannot be revoked now, the next run does it."""
    try:
        asyncio.run(_revoke_minted(record))
    except (Exception, KeyboardInterrupt) as error:  # a second Ctrl-C must not skip stopping the rest
        why = str(error) if isinstance(error, Exception) else "interrupted"
        print(f"canopy: this run's API key could not be revoked ({why}): the next canopy up on this data dir "
              "revokes it", file=sys.stderr, flush=True)


def port_free(host: str, port: int) -> bool:
    """Whether a server can listen on ``host:port`` now. Probed the way the servers bind it:
    uvicorn in Serve's proxy and aiohttp in Ray's dashboard set ``SO_REUSEADDR``, so the
    connections of a killed predecessor lingering in TIME_WAIT do not count, while a live
    listener still does (the probe does not set ``SO_REUSEPORT``, which Serve's proxy also
    sets and which would let a second server share the port unnoticed)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _holder(port: int) -> str:
    """`` (pid N, name)`` of the process listening on ``port``, when this user may see it."""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f" (by pid {conn.pid}, {psutil.Process(conn.pid).name()})"
    return ""


def _check_ports(listeners: list[tuple[str, str, int, str]], grace: float) -> None:
    """Each listener (what, host, port, the flag that changes it) free, waiting up to ``grace`` s."""
    deadline = time.monotonic() + grace
    for what, host, port, flag in listeners:
        waiting = False
        while not port_free(host, port):
            if time.monotonic() >= deadline:
                raise StartupError(f"{what} port {hostport(host, port)} is already in use{_holder(port)}: choose "
                                   f"another with {flag}")
            if not waiting:
                print(f"  waiting for {hostport(host, port)} to be released by the previous run", flush=True)
                waiting = True
            time.sleep(0.5)


def _stop_processes(marker: str) -> int:
    """Stop every process whose command line contains ``marker``; how many there were."""
    found = [proc for proc in psutil.process_iter(["cmdline"]) if marker in " ".join(proc.info["cmdline"] or [])]
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(found, timeout=_STOP_GRACE_SECONDS)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return len(found)


def _stop_previous_ray(previous: dict[str, Any]) -> None:
    """A run that did not stop left its Ray session: its head processes (found by their session
    dir) are stopped, and its workers follow their raylet."""
    session = previous.get("ray_session_dir")
    count = _stop_processes(str(session)) if session else 0
    what = f"stopped {count} leftover processes of its Ray session" if count else "its Ray session left nothing running"
    print(f"  previous run (pid {previous.get('pid', '?')}) ended without stopping: {what}", flush=True)


def _adopt_previous_pg(previous: dict[str, Any], data_dir: Path) -> Path | None:
    """The embedded PostgreSQL a run that did not stop left running is reused, and this run
    stops it; the data dir whose server this run now owns."""
    if not previous.get("embedded_pg"):
        return None
    pid = running_postmaster(data_dir)
    if pid is None:
        print("  previous run's embedded PostgreSQL is not running: starting it (it recovers from its log)",
              flush=True)
        return None
    print(f"  previous run's embedded PostgreSQL (pid {pid}) still runs: reusing it (stopped when this run stops)",
          flush=True)
    return data_dir


@contextlib.contextmanager
def _step(label: str) -> Iterator[None]:
    """``  label … ok (0.8 s)``: the label as the step starts, the outcome when it ends."""
    print(f"  {label} …", end=" ", flush=True)
    began = time.monotonic()
    try:
        yield
    except BaseException:
        print("failed", flush=True)
        raise
    print(f"ok ({time.monotonic() - began:.1f} s)", flush=True)


def ray_token_location() -> str | None:
    """Where the token of a Ray started here is (Ray's order: ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``); None when token authentication is off."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")


def _exit_on_sigterm(signum: int, _: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _init_ray(settings: Settings, database_url: str, host: str, dashboard_port: int,
              expose_ray: bool) -> dict[str, Any]:
    if settings.ray_address is not None:
        context = init_ray(settings, database_url, logging_level=logging.WARNING)
        return {"dashboard_url": context.dashboard_url, "session_dir": None}
    context = init_ray(settings, database_url, logging_level=logging.WARNING, include_dashboard=True,
                       dashboard_host=host if expose_ray else LOOPBACK, dashboard_port=dashboard_port,
                       _node_ip_address=None if expose_ray else LOOPBACK)
    node_address = ray.util.get_node_ip_address()
    if not expose_ray and not ipaddress.ip_address(node_address).is_loopback:
        raise CanopyError(f"Ray started with the node address {node_address}, so it would listen beyond loopback: "
                           "Ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set (run `canopy up`, "
                           "or set it in the environment); use --expose-ray to open Ray on purpose")
    return {"dashboard_url": context.dashboard_url, "session_dir": context.address_info.get("session_dir")}


async def _prepare(settings: Settings) -> tuple[str, uuid.UUID]:
    """Start the detached gateway and sweeper, and mint an API key for the default scope; it and its id."""
    runtime = await Runtime.start(settings)
    try:
        if problem := await runtime.default_model_problem():  # e.g. its provider's key is missing
            raise StartupError(problem)
        async with runtime.db.tx() as conn:
            api_key, row = await scopes.issue_key(conn, DEFAULT_SCOPE)
        return api_key, row["key_id"]
    finally:
        await runtime.close()


def _serve_on_cluster(host: str, port: int) -> bool:
    """Whether Serve must be started on the cluster joined (it does not run there). Serve cannot
    move its proxies once started, and ``serve.start`` would only warn and keep them where they
    are; nor may a second run deploy over a first one's application and delete it on leaving."""
    running = serve_http_address()
    if running is None:
        _check_ports([("the API's", host, port, "--port")], 0.0)
        return True
    if APP_NAME in serve.status().applications:
        raise StartupError(f"a canopy up already serves this cluster (its API on {hostport(*running)}): use it, "
                           "or stop it first")
    if running != (host, port):
        raise StartupError(f"Serve already runs on this cluster with its HTTP proxies on {hostport(*running)} and "
                           f"cannot move them: use --host {running[0]} --port {running[1]}, or stop that Serve first "
                           "(`serve shutdown`)")
    return False


def _stop(started: Started) -> None:
    if started.serve_app:
        # The replicas stop gracefully; a local Ray's Serve controller and proxy then go with
        # the cluster (serve.shutdown() would kill the controller mid-call, which Ray reports).
        # On a cluster it joined, a Serve this run started goes whole: its proxy would hold the
        # port, and the next run's options would be ignored.
        with contextlib.suppress(Exception):
            if started.joined_serve:
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
    replicas running with ``env``. Blocks until the application is ready. Serve's controller
    and proxy log warnings and errors only (its INFO lines would bury ``canopy up``'s own)."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port},
                logging_config={"log_level": "WARNING"})
    serve.run(application(env, num_replicas=replicas), name=APP_NAME, route_prefix="/")


def up(host: str = LOOPBACK, port: int = 8000, data_dir: Path | None = None, dashboard_port: int = 8265,
       replicas: int = 1, expose_ray: bool = False) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1" if expose_ray else "0")
    # Serve gives its HTTP proxy 5 s to answer its readiness check, then warns and counts it as
    # failing; on a loaded 2-core machine the proxy's start takes longer (seen in CI). The Ray that
    # canopy up starts hands this to Serve's controller.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
    if data_dir is not None:
        os.environ["CANOPY_DATA_DIR"] = str(data_dir)
    get_settings.cache_clear()
    settings = get_settings()
    generated_token = settings.admin_token is None
    if generated_token:  # kept in this process and the secrets directory, never in an environment
        made = SecretStr(GENERATED_ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(24))
        settings = settings.model_copy(update={"admin_token": made})
    began = time.monotonic()
    record = RunRecord(settings.data_dir)
    started = Started()
    try:
        if expose_ray and settings.ray_address is None and ray_token_location() is None:
            raise StartupError("--expose-ray needs Ray's token authentication: with RAY_AUTH_MODE="
                               f"{os.environ.get('RAY_AUTH_MODE')} whoever reaches Ray runs code on this machine; "
                               "unset RAY_AUTH_MODE (or set it to token), or leave Ray on loopback")
        if settings.database_url is None:
            # A cluster of several nodes needs a database they all reach: refused before anything starts.
            require_one_node(settings.ray_address)
        if settings.ray_address is None:  # joining a cluster, the API listens on its head node, maybe elsewhere
            require_local_address(host)
        previous = record.acquire()
        print(f"Starting Canopy {__version__} (data dir {settings.data_dir})", flush=True)
        if previous is not None:
            _stop_previous_ray(previous)
        # Checked first: Serve would otherwise keep retrying its proxy on a taken port. Joining a
        # cluster, the API's port may be its Serve's own: checked once Ray tells (_serve_on_cluster).
        if settings.ray_address is None:
            _check_ports([("the API's", host, port, "--port"),
                          ("Ray's dashboard", host if expose_ray else LOOPBACK, dashboard_port, "--dashboard-port")],
                         PORT_GRACE_SECONDS if previous is not None else 0.0)
        if previous is not None:
            started.embedded_pg = _adopt_previous_pg(previous, settings.data_dir)
        _warn(settings, host, expose_ray)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)  # until the service loop below takes over
        api_key, dashboard = _start(settings, started, record, host, port, dashboard_port, replicas, expose_ray)
        print(f"  ready ({time.monotonic() - began:.1f} s)", flush=True)
        _announce(host, port, dashboard, api_key, settings, generated_token, started.local_ray)
        _serve_until_signalled()
        return 0
    except (StartupError, DatabaseUnreachable, RayUnreachable, SharedDatabaseRequired) as error:
        print(f"canopy: {error}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        try:
            if record.minted_here:  # before the database stops
                _revoke_on_stop(record)
        finally:
            if started != Started():
                print("canopy: stopping…", flush=True)
                _stop(started)
                print("canopy: stopped", flush=True)
            record.release()


def _warn(settings: Settings, host: str, expose_ray: bool) -> None:
    """The warnings ``canopy up`` prints on purpose: what it exposes or does not isolate."""
    if expose_ray and settings.ray_address is None:
        print(f"canopy: WARNING: --expose-ray: Ray (GCS, raylet, workers, agents) listens on this machine's "
              f"address and its dashboard on {host}; whoever reaches them with the cluster's Ray token "
              f"({ray_token_location()}) can run code here",
              file=sys.stderr, flush=True)
    sandbox_warning = backend_warning(settings)
    if sandbox_warning:
        print(f"canopy: {sandbox_warning}", file=sys.stderr, flush=True)


def _start(settings: Settings, started: Started, record: RunRecord, host: str, port: int, dashboard_port: int,
           replicas: int, expose_ray: bool) -> tuple[str, str | None]:
    """Each step in turn, recorded before it starts what it starts; the API key and the dashboard's URL."""
    embedded = settings.database_url is None
    with _step("database (embedded PostgreSQL)" if embedded else "database"):
        if embedded and started.embedded_pg is None and running_postmaster(settings.data_dir) is None:
            started.embedded_pg = settings.data_dir
        record.save(started)
        database_url = resolve_database_url(settings)
        ensure_schema(database_url)
    if revoked := asyncio.run(_revoke_minted(record)):
        print(f"  revoked {revoked} API key{'s' * (revoked > 1)} that earlier runs printed", flush=True)
    started.local_ray = settings.ray_address is None
    with _step("Ray (local)" if settings.ray_address is None else f"Ray (joining {settings.ray_address})"):
        ray_info = _init_ray(settings, database_url, host, dashboard_port, expose_ray)
        started.ray_session_dir = ray_info["session_dir"]
        record.save(started)
    with _step("gateway"):
        api_key, key_id = asyncio.run(_prepare(settings))
        record.remember_key(key_id)
    with _step(f"API (Serve on {hostport(host, port)})"):
        started.joined_serve = settings.ray_address is not None and _serve_on_cluster(host, port)
        started.serve_app = True
        start_serve(worker_env(settings, database_url), host, port, replicas)
    return api_key, ray_info["dashboard_url"]


def _announce(host: str, port: int, dashboard: str | None, api_key: str, settings: Settings,
              generated_token: bool, local_ray: bool) -> None:
    base = f"http://{hostport(host, port)}"
    # A token the operator chose is a secret they already have: only a generated one is shown.
    token = reveal(settings.admin_token) if generated_token else "(from CANOPY_ADMIN_TOKEN)"
    ray_token = ray_token_location()
    lines = [
        "Canopy is up.",
        f"  API        {base}/api/v1   (reference: {base}/docs)",
        # The key rides in the fragment, which browsers never send: the UI stores it and scrubs the address.
        f"  UI         {base}/#key={api_key}",
        f"  Dashboard  {'http://' + dashboard if dashboard and '://' not in dashboard else dashboard or 'n/a'}",
        f"  API key    {api_key}   (scope {DEFAULT_SCOPE.user_id}/{DEFAULT_SCOPE.app_id}; this run's: revoked when "
        "it stops)",
        f"  Admin      {token}" + ("   (generated; set CANOPY_ADMIN_TOKEN to choose one)" if generated_token else ""),
    ]
    if local_ray:
        # The dashboard and Ray's state API (`ray list actors`, ...) ask for Ray's token.
        lines.append(f"  Ray token  {ray_token}   (the dashboard asks for it; `ray get-auth-token` prints it)"
                     if ray_token else "  Ray token  none: token authentication is off (RAY_AUTH_MODE)")
    lines += [f"  Data       {settings.data_dir}", "Press Ctrl-C to stop."]
    print("\n".join(lines), flush=True)


def _serve_until_signalled() -> None:
    stop = threading.Event()

    def request_stop(signum: int, _: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    while not stop.wait(0.5):
        pass
