"""The Python entry point: start or join the runtime, and act on sessions as a human or the API.

``Runtime.start()`` resolves the database (embedded by default), ensures the schema,
starts or connects to Ray, and makes sure this node's ModelGateway (actors/gateways.py) and the
sweeper run. Every operation commits first, then sends hints.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import stat
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import ray

from actors import gateways, hosting, signals
from actors.agent_loop import DEFAULT_INSTRUCTIONS
from actors.gateways import secrets_path
from actors.naming import NAMESPACE, SWEEPER_NAME, named_options
from actors.ray_compat import system_config_options
from actors.sweeper import Sweeper
from actors.toolbox import check_tool_names
from persistence import (
    agents,
    embedded,
    projects,
    quotas,
    schedules,
    scopes,
    sessions,
    stream_watchers,
    trees,
    turns,
    usage,
    views,
)
from persistence.cooperation import record_intervention
from persistence.db import WAIT_SECONDS, Connection, Database, resolve_database_url, retrying_deadlocks
from persistence.errors import Conflict, InvalidArgument, RayUnreachable
from persistence.messages import steer
from persistence.migrations import ensure_schema
from persistence.records import Row, Scope
from persistence.settings import (
    ENV_PREFIX,
    GENERATED_ADMIN_TOKEN_PREFIX,
    Settings,
    env_names,
    get_settings,
    reveal,
    secret_env_names,
    secret_fields,
)
from persistence.statuses import TERMINAL_TURN_STATUSES, Activity

log = logging.getLogger(__name__)
# Held (flock) by the canopy up serving a data dir, with its pid (api/up.py's RunRecord).
UP_LOCK = "canopy-up.lock"

# Runs inside a write's own transaction, after the write and before the commit, with the
# write's result: the HTTP layer stores its Idempotency-Key receipt here, so the write
# and its receipt commit together (raising rolls both back).
TxHook = Callable[[Connection, Any], Awaitable[None]]


async def _run_hook(hook: TxHook | None, conn: Connection, result: Any) -> None:
    if hook is not None:
        await hook(conn, result)


async def _after_commit(*hints: Awaitable[Any]) -> None:
    """Send a committed write's hints. The write stands whatever becomes of them (the sweep derives
    each again from the rows), so one that fails is logged, never answered as the write's failure:
    a caller told a committed write failed retries it, and an answer or a cancel is then refused."""
    for hint in hints:
        try:
            await hint
        except Exception:
            log.exception("a hint after a committed write failed; the sweep takes it up")


def default_agent_config(settings: Settings) -> dict[str, Any]:
    return {"agent_id": None, "name": "assistant", "model": settings.default_model,
            "instructions": DEFAULT_INSTRUCTIONS, "tools": [], "approval_mode": "auto"}


def _secrets_directory(settings: Settings) -> Path:
    directory = secrets_path(settings)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def _write_secret_file(path: Path, value: str) -> None:
    """Replaced whole (written aside, then renamed), so a reader never sees half a value; 0600."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(value)
    aside.replace(path)


# The files of the secrets directory Canopy wrote, each with the SHA-256 of what it wrote (a JSON
# object, 0600): the directory is also where an operator puts a cluster's secrets (cluster.yaml).
# A file is recorded before it is written, with the digests of its old value and its new one (a
# list) until it has the new one, so a runtime killed at any step leaves each file it wrote Canopy's
# by the record, whichever value it holds.
_WRITTEN = ".canopy-written"
# Each file's digests of the values Canopy may have left in it.
Written = dict[str, set[str]]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The secrets directory locked (``flock`` of the directory itself, so that a refused runtime leaves
    no file behind) while a runtime reads, changes and writes it and its record: runtimes starting at
    once (two ``canopy run``) take turns, each reading what the one before wrote. The kernel drops the
    lock of a killed process. A filesystem that cannot lock a directory (NFS emulates ``flock`` with
    locks a read-only descriptor cannot take) goes unlocked, as before the lock, with a warning: a
    runtime that could not start there would be worse than the race."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.warning("the secrets directory %s cannot be locked (%s): two runtimes starting at once may "
                        "take each other's files for an operator's", directory, error.strerror)
        yield
    finally:
        os.close(fd)


def _written(directory: Path, data_dir: Path) -> Written:
    try:
        record = json.loads((directory / _WRITTEN).read_text())
        return {str(name): {digests} if isinstance(digests, str) else set(map(str, digests))
                for name, digests in record.items()}
    except FileNotFoundError:
        return _written_before_the_record(directory, data_dir.expanduser().resolve())
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _save_written(directory: Path, written: Written) -> None:
    # A file's one digest as a string, as a Canopy before the lists reads it.
    _write_secret_file(directory / _WRITTEN, json.dumps(
        {name: next(iter(digests)) if len(digests) == 1 else sorted(digests) for name, digests in written.items()}))


def _written_before_the_record(directory: Path, data_dir: Path) -> Written:
    """What a Canopy before :data:`_WRITTEN` wrote, as far as it can be told from an operator's
    secrets (whose recipe makes tokens of the same form): the URL of the embedded database this data
    dir holds (its socket has moved since), and the admin token canopy up makes, where a canopy up
    served this data dir. Without them every data dir it served would refuse its next runtime."""
    def embedded_here(url: str) -> bool:
        return (data_dir / "pg" / "PG_VERSION").exists() and embedded.is_embedded_url(url, data_dir)

    def made_by_canopy_up(token: str) -> bool:
        return (data_dir / UP_LOCK).exists() and token.startswith(GENERATED_ADMIN_TOKEN_PREFIX)

    found: Written = {}
    for name, ours in ((f"{ENV_PREFIX}database_url", embedded_here), (f"{ENV_PREFIX}admin_token", made_by_canopy_up)):
        with contextlib.suppress(OSError):
            text = (directory / name.lower()).read_text()
            if ours(text):
                found[name.lower()] = {_digest(text)}
    return found


def _write_secrets(settings: Settings, database_url: str) -> Path:
    """The runtime's secrets as files only its user can read: ``<data dir>/secrets`` (0700), one
    file per secret setting (0600), named as ``Settings`` reads them from ``CANOPY_SECRETS_DIR``.
    A data dir serves one runtime configuration: the last runtime started on it wrote what its
    workers read; a secret the runtime does not have is removed. Only the files Canopy wrote (and
    nobody changed since) are replaced or removed: one an operator put there (the cluster's secrets,
    cluster.yaml) stays as it is, and a runtime with another value of it is refused (its workers
    would read the operator's). While a ``canopy up`` serves the data dir, the files are that run's
    (its replicas read them when they restart): a runtime started beside it (``canopy run``) uses
    them as they are, and is refused if it would use another database than the one they name,
    where its driver and its workers would each write to their own."""
    directory = _secrets_directory(settings)
    holder = serving_pid(settings.data_dir)
    if holder is not None:
        served = directory / f"{ENV_PREFIX}database_url".lower()
        if served.exists() and served.read_text() != database_url:
            raise Conflict(f"a canopy up (pid {holder}) serves the data dir {settings.data_dir} with another "
                           "database: use its database (the same CANOPY_DATABASE_URL, or none for its embedded "
                           "one), or another data dir (CANOPY_DATA_DIR)")
        return directory
    values = {name: reveal(getattr(settings, name)) for name in secret_fields()}
    values["database_url"] = database_url
    files = {name: f"{ENV_PREFIX}{name}".lower() for name in values}
    with _locked(directory):
        written = _written(directory, settings.data_dir)
        found = {name: path.read_text() for name, file in files.items() if (path := directory / file).exists()}
        ours = {name for name, text in found.items() if _digest(text) in written.get(files[name], set())}
        for name, value in values.items():  # all checked before anything changes
            if name in found and name not in ours and value is not None and found[name] != value:
                file, variable = files[name], " or ".join(env_names(name))
                what = ("a database URL of another database than this runtime's" if name == "database_url"
                        else f"another value than this runtime's {variable}")
                raise Conflict(f"the secrets directory {directory} holds {file} with {what}, and Canopy did not "
                               f"write it (an operator's secret, or one a Canopy before {_WRITTEN} existed wrote): "
                               f"set CANOPY_SECRETS_DIR={directory} to use it (and unset {variable}), or remove the "
                               "file if it is not needed, or use another data dir (CANOPY_DATA_DIR)")
        new = {files[name]: value for name, value in values.items()
               if value is not None and (name not in found or (name in ours and found[name] != value))}
        gone = [files[name] for name, value in values.items() if value is None and name in ours]
        _change_files(directory, written, new, gone,
                      [files[name] for name, value in values.items() if value is None and name not in found])
    return directory


def _change_files(directory: Path, written: Written, new: dict[str, str], gone: list[str], absent: list[str]) -> None:
    """Write the ``new`` files, remove the ``gone`` ones, and record it all, ``absent`` files no longer:
    each file to write recorded with its new value's digest first, then written; a removed file left
    in the record until it is gone."""
    if new:
        for file, value in new.items():
            written.setdefault(file, set()).add(_digest(value))
        _save_written(directory, written)
    for file, value in new.items():
        _write_secret_file(directory / file, value)
        written[file] = {_digest(value)}
    for file in gone:
        (directory / file).unlink()
    for file in (*gone, *absent):
        written.pop(file, None)
    _save_written(directory, written)


def serving_pid(data_dir: Path) -> str | None:
    """The pid of another process's ``canopy up`` that serves ``data_dir`` (it holds
    :data:`UP_LOCK` locked while it runs and writes its pid there), or None."""
    try:
        fd = os.open(data_dir.expanduser().resolve() / UP_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        return None if holder == str(os.getpid()) else holder
    finally:
        os.close(fd)  # which drops a lock taken here


def private_ray_token(*, replace_readable: bool = True) -> str | None:
    """Whoever reads Ray's token may run code on the cluster (its dashboard's job API). For a cluster
    it starts, Ray writes a missing one to ``~/.ray/auth_token`` with the process's umask (0644 in a
    0755 directory: every local user's). It is written here first, its owner's only (64 hex digits,
    as Ray makes it), and an existing one of ours that others could read is replaced by a new one:
    making it private would not take back a copy already read. Without ``replace_readable`` (a
    diagnosis, which must not cut a running cluster's clients off) such a token is left as it is,
    and what to do about it is returned. A token the environment names (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``) is the operator's to keep."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") \
            or os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return None
    path = Path.home() / ".ray" / "auth_token"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as token:
            token.write(secrets.token_hex(32))
        return None
    except FileExistsError:
        pass
    found = path.stat()
    if not found.st_mode & 0o077 or found.st_uid != os.geteuid():
        return None
    readable = f"Ray's token {path} could be read by other users (mode {stat.S_IMODE(found.st_mode):o})"
    if not replace_readable:
        return f"{readable}: canopy up replaces it (restart a Ray cluster that uses it then)"
    log.warning("%s: replaced by a new one, its owner's only (a Ray cluster still running with the old one "
                "must be restarted)", readable)
    _write_secret_file(path, secrets.token_hex(32))
    return None


def _move_provider_env(settings: Settings) -> None:
    """The provider variables (``settings.provider_env``: keys, endpoints) leave this process's
    environment, which every process it starts would inherit, for files of the secrets
    directory named like them: only the model gateway reads them there. A file whose variable
    this process does not have stays (a runtime started earlier moved it, or the operator put
    it there); removing the file is how an operator takes a key away. While a ``canopy up``
    serves the data dir, its files stay as they are (``_write_secrets``)."""
    directory = _secrets_directory(settings)
    holder = serving_pid(settings.data_dir)
    for name in settings.provider_env:
        value = os.environ.pop(name, None)
        if not value:
            continue
        if holder is None:
            _write_secret_file(directory / name, value)
        elif not (directory / name).exists() or (directory / name).read_text() != value:
            log.warning("%s is not used: the canopy up (pid %s) serving %s gives the model gateway its own "
                        "provider settings", name, holder, settings.data_dir)


# glibc gives the threads of a process up to 8 malloc arenas per core, and what is freed in them
# mostly stays with the process: a session host, whose sessions' work moves among Ray's threads and
# the event loop's, grew 28 MiB per 1,000 sessions served without end; with two arenas 1.2 MiB
# (bench/host_memory.py), its fan-outs no slower. glibc reads it when a process starts, so it is
# set for the processes Ray starts (and in cluster.yaml and the image for a cluster's nodes).
MALLOC_ARENA_MAX = "2"


def _worker_env(settings: Settings, database_url: str) -> dict[str, str]:
    """Every non-secret ``CANOPY_*`` and ``OTEL_*`` variable of this process, the data dir, the path of the
    secrets directory (``_write_secrets``) and the malloc arenas: no token, key or password ever
    travels in an environment, where Ray's dashboard (runtime_env) or ``/proc/<pid>/environ``
    would show it."""
    hidden = secret_env_names() | {f"{ENV_PREFIX}SECRETS_DIR"}
    env = {key: value for key, value in os.environ.items()
           if key.upper().startswith(ENV_PREFIX) and key.upper() not in hidden}
    # The OpenTelemetry exporter's settings, which a joined cluster's workers have no other way to
    # get, but not its headers: they carry a collector's token (each node's own environment must).
    env.update({key: value for key, value in os.environ.items()
                if key.upper().startswith("OTEL_") and "HEADERS" not in key.upper()})
    env.update({"CANOPY_DATA_DIR": str(settings.data_dir),
                "CANOPY_SECRETS_DIR": str(_write_secrets(settings, database_url)),
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX),
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")})
    return env


def worker_env(settings: Settings, database_url: str) -> dict[str, str]:
    """The environment every Canopy worker process needs (for ``ray.init`` or a Serve
    deployment); writes the secrets it points to (``settings``' tokens and ``database_url``)."""
    return _worker_env(settings, database_url)


# What Canopy's actors import (psycopg, pydantic settings, the actor modules: ~120 ms of CPU
# here), imported by every worker process as it starts instead of when an actor is placed
# on it: an actor that lands on a warm worker starts without paying it (a new tree's
# supervisor: ~160 -> ~45 ms from queued to granted, bench/fanout.py --profile).
WORKER_PRELOAD_MODULES = ("actors.hosting",)
# Ray gives its workers OOM score adjustment 1000 (the kernel's first choice when memory runs out,
# before the raylet), the score of a sandbox's commands too (sandbox/base.py): Canopy's workers (the
# gateway, the hosts, the sweeper, the API's replicas) take less, so a model's command goes first.
RAY_WORKER_OOM_SCORE_ADJ = 500


def logging_config() -> ray.LoggingConfig:
    """Ray's logging of the job, driver and workers alike: one JSON object per line (Ray's fields —
    job, node, worker, actor and task ids — plus the logger's name and a record's ``extra`` fields,
    such as the ids of persistence/lifecycle.py's state changes), at INFO so those lines are kept."""
    return ray.LoggingConfig(encoding="JSON", log_level="INFO", additional_log_standard_attrs=["name"])


def _join_ray(address: str, **options: Any) -> Any:
    """Ray's context for the cluster at ``address``, or RayUnreachable saying what to check. Ray
    sends a token to an address it is given only when ``RAY_AUTH_MODE=token`` is set before it is
    imported (it never sends the local cluster's token to an address of someone's choosing), and a
    cluster with token authentication, Ray's default, answers a client without one as if it were
    not there: "Failed to connect", after 20 s."""
    try:
        return ray.init(address=address, namespace=NAMESPACE, **options)
    except (ConnectionError, ray.exceptions.AuthenticationError) as error:
        hint = "" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else (
            "; if it uses token authentication (Ray's default), set RAY_AUTH_MODE=token and give this machine "
            "the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token: `ray get-auth-token` "
            "on its head prints it)")
        raise RayUnreachable(f"cannot join the Ray cluster at {address} (CANOPY_RAY_ADDRESS): {error}{hint}") from None


def init_ray(settings: Settings, database_url: str, **options: Any) -> Any:
    """Join ``settings.ray_address``, or start a Ray of this process's own (never some other
    cluster that happens to run on the machine); returns Ray's context.

    Joining, the workers get Canopy's environment as the job's runtime_env (on a cluster of
    several machines, each node needs the secrets directory at the same path, or its own
    ``CANOPY_*`` settings). Starting Ray here, this process puts it in its own environment
    instead (and takes its secrets out of it), which Ray's processes and workers inherit: a
    runtime_env makes every worker start through ``setup_worker.py``, a second interpreter
    start that cost ~30% of a session actor's start here (bench/fanout.py:
    4.07x -> 3.04x of the ideal, 16.3 -> 11.5 s of CPU). A Ray started here also preloads
    :data:`WORKER_PRELOAD_MODULES` in its workers, which take :data:`RAY_WORKER_OOM_SCORE_ADJ`
    (a cluster's head sets both with ``ray start --system-config``, see cluster.yaml).
    """
    _move_provider_env(settings)
    env = _worker_env(settings, database_url)
    options.setdefault("logging_config", logging_config())
    root_level = logging.getLogger().level
    if settings.ray_address:
        context = _join_ray(settings.ray_address, runtime_env={"env_vars": env}, **options)
    else:
        # Every process Ray starts inherits this environment: the secrets leave it (they are in the
        # secrets directory, which ``Settings`` reads from now on, here too).
        for key in [key for key in os.environ if key.upper() in secret_env_names()]:
            del os.environ[key]
        os.environ.update(env)
        private_ray_token()
        context = ray.init(address="local", namespace=NAMESPACE,
                           **system_config_options(WORKER_PRELOAD_MODULES, RAY_WORKER_OOM_SCORE_ADJ), **options)
    # The logging config set this process's loggers to INFO too: the driver keeps its own levels
    # (other libraries' INFO lines stay out of a CLI's output) except for Canopy's state changes.
    logging.getLogger().setLevel(root_level)
    logging.getLogger("canopy").setLevel(logging.INFO)
    if "logging_level" in options:
        logging.getLogger("ray").setLevel(options["logging_level"])
    return context


ModelCheck = Callable[[str, str | None, str | None], Awaitable[str | None]]


async def require_usable_model(check: ModelCheck, fields: dict[str, Any]) -> dict[str, Any]:
    """The agent's model, api_base and api_key_ref, refused (InvalidArgument, 422) unless the
    gateway can use them: the sentence names the missing variable or key. Makes no request."""
    endpoint = {field: fields.get(field) for field in agents.ENDPOINT_FIELDS}
    agents.check_endpoint(endpoint["api_base"], endpoint["api_key_ref"])
    problem = await check(endpoint["model"], endpoint["api_base"], endpoint["api_key_ref"])
    if problem:
        raise InvalidArgument(problem)
    return endpoint


class Runtime:
    def __init__(self, db: Database, settings: Settings, database_url: str) -> None:
        self.db = db
        self.settings = settings
        self.database_url = database_url
        self.placement = hosting.placement_for(settings)

    @classmethod
    async def start(cls, settings: Settings | None = None, *, include_dashboard: bool = False,
                    num_cpus: int | None = None, db_wait_seconds: float = WAIT_SECONDS,
                    db_pool_max: int | None = None) -> Runtime:
        """The runtime of this process, starting what it needs. ``db_wait_seconds``: how long a
        transaction of this process waits for a connection (an API answers sooner than a Run);
        ``db_pool_max``: its pool's size (``settings.db_pool_max`` by default)."""
        settings = settings or get_settings()
        database_url = resolve_database_url(settings)
        ensure_schema(database_url)
        if not ray.is_initialized():
            init_ray(settings, database_url, include_dashboard=include_dashboard, dashboard_host="127.0.0.1",
                     num_cpus=num_cpus, logging_level=logging.WARNING)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        await (await gateways.local_gateway()).warm_up.remote()  # other nodes' gateways start with their first call
        sweeper = Sweeper.options(**named_options(SWEEPER_NAME)).remote()
        await sweeper.start.remote()
        return cls(await Database.connect(database_url, max_size=db_pool_max, wait_seconds=db_wait_seconds),
                   settings, database_url)

    async def close(self, *, shutdown_ray: bool = False) -> None:
        await self.db.close()
        if shutdown_ray and ray.is_initialized():
            ray.shutdown()

    # -- creating work -----------------------------------------------------------------------------

    async def create_root(self, scope: Scope, *, input_text: str | None = None, agent_id: str | None = None,
                          project_id: uuid.UUID | None = None, title: str = "",
                          origin_kind: str = "human", budget: dict[str, Any] | None = None,
                          in_tx: TxHook | None = None) -> Row:
        """A new root session (its own tree); ``input_text`` is submitted at once. ``budget``: the
        tree's budget (``{max_tokens, max_cost_usd, max_seconds, max_model_calls}``, each optional);
        without one the agent's default budget applies, if it has one."""
        if input_text is not None:
            turns.check_text(input_text, "input")
        if budget is not None:
            usage.check_budget(budget)
        async with self.db.tx() as conn:
            await quotas.check_room(conn, scope, "roots", self.settings.max_roots_per_scope)
            if project_id is None:
                project = await projects.default_project(conn, scope, self.projects_root)
            else:
                project = await projects.get_project(conn, scope, project_id, for_new_tree=True)
            if agent_id is None:
                config = default_agent_config(self.settings)
            else:
                config = agents.frozen_config(await agents.get_agent(conn, scope, agent_id))
            root_id = await sessions.create_root(
                conn, scope, project_id=project["project_id"], agent_id=agent_id, agent_config=config,
                slot_limit=self.settings.tree_slots, title=title or (input_text or "")[:80],
                origin={"kind": origin_kind}, budget=budget if budget is not None else config.get("budget"))
            receipt = None
            hints = signals.NO_HINTS
            if input_text is not None:
                receipt = await turns.submit_first_input(conn, scope, root_id, root_id, input_text,
                                                         {"kind": origin_kind})
                hints = await signals.change_hints(conn, [], hand_off_tree=root_id)  # the new tree's first slot
            session = await sessions.get_session(conn, scope, root_id)
            created = {"session": session, "input": receipt}
            await _run_hook(in_tx, conn, created)
        await _after_commit(signals.send_hints(self.placement, self.db, hints))
        return created

    async def submit_input(self, scope: Scope, session_id: uuid.UUID, text: str,
                           origin_kind: str = "human", in_tx: TxHook | None = None) -> Row:
        async with self.db.tx() as conn:
            receipt = await turns.submit_input(conn, scope, session_id, text, {"kind": origin_kind})
            if origin_kind == "human":
                await record_intervention(conn, scope, session_id, "input", {"input_id": str(receipt["input_id"])},
                                          text=text)
            await _run_hook(in_tx, conn, receipt)
            tree_id = (await sessions.get_session_row(conn, scope, session_id))["tree_id"]
            # A Turn that starts at once gets its slot in this commit when the tree has one free.
            hints = await signals.change_hints(conn, [session_id],
                                               hand_off_tree=tree_id if receipt["turn_id"] else None)
        await _after_commit(signals.send_hints(self.placement, self.db, hints))
        return receipt

    # -- acting on work ----------------------------------------------------------------------------

    async def cancel_turn(self, scope: Scope, session_id: uuid.UUID, turn_id: uuid.UUID,
                          in_tx: TxHook | None = None) -> None:
        async with self.db.tx() as conn:
            live = await turns.cancel_turn(conn, scope, session_id, turn_id, reason="cancelled by a human")
            if live is not None:  # a Turn that had ended stays as it was, and nobody is told of a cancel
                await record_intervention(conn, scope, session_id, "cancel", {"turn_id": str(turn_id)})
            await _run_hook(in_tx, conn, None)
        await _after_commit(*([self.placement.activate(session_id)] if live else []),
                            signals.after_change(self.placement, self.db, [session_id]))

    async def cancel_input(self, scope: Scope, input_id: uuid.UUID, in_tx: TxHook | None = None) -> Row:
        async with self.db.tx() as conn:
            result = await turns.cancel_input(conn, scope, input_id)
            await _run_hook(in_tx, conn, result)
        await _after_commit(signals.after_change(self.placement, self.db, [result["session_id"]]))
        return result

    async def steer(self, scope: Scope, session_id: uuid.UUID, text: str, in_tx: TxHook | None = None) -> Row:
        async with self.db.tx() as conn:
            result = await steer(conn, scope, session_id, text)
            await record_intervention(conn, scope, session_id, "steer", {"message_id": str(result["message_id"]),
                                                                         "turn_id": str(result["turn_id"])}, text=text)
            await _run_hook(in_tx, conn, result)
        return result

    async def answer_request(self, scope: Scope, request_id: uuid.UUID, response: dict[str, Any],
                             in_tx: TxHook | None = None) -> Row:
        async with self.db.tx() as conn:
            request = await trees.answer_request(conn, scope, request_id, response)
            await record_intervention(conn, scope, request["session_id"], "answer",
                                      {"request_id": str(request_id), "kind": request["kind"]},
                                      text=response.get("answer") or response.get("decision"))
            await _run_hook(in_tx, conn, request)
        await _after_commit(signals.resume_wait(self.placement, self.db, request["wait_id"]))
        return request

    async def stop_tree(self, scope: Scope, tree_id: uuid.UUID, in_tx: TxHook | None = None) -> list[uuid.UUID]:
        async def stopping() -> list[uuid.UUID]:
            async with self.db.tx() as conn:
                live = await trees.stop_tree(conn, scope, tree_id)
                await _run_hook(in_tx, conn, live)
            return live

        live = await retrying_deadlocks(stopping)
        await _after_commit(asyncio.gather(*(self.placement.activate(session_id) for session_id in live)),
                            signals.after_tree_change(self.placement, self.db, tree_id))
        return live

    async def continue_tree(self, scope: Scope, tree_id: uuid.UUID,
                            in_tx: TxHook | None = None) -> list[uuid.UUID]:
        async with self.db.tx() as conn:
            started = await trees.continue_tree(conn, scope, tree_id)
            await _run_hook(in_tx, conn, started)
        self.placement.poke_tree(tree_id)
        return started

    async def set_budget(self, scope: Scope, tree_id: uuid.UUID, changes: dict[str, Any],
                         in_tx: TxHook | None = None) -> Row:
        """Change a tree's budget (a limit given as None is removed; the others stay) and return the
        tree's summary. Raising it does not restart a stopped tree: ``continue_tree`` does."""
        async with self.db.tx() as conn:
            await usage.set_budget(conn, scope, tree_id, changes)
            summary = await trees.tree_summary(conn, scope, tree_id)
            await _run_hook(in_tx, conn, summary)
        return summary

    async def watch_tree(self, scope: Scope, tree_id: uuid.UUID, seconds: float = 60.0) -> None:
        """Mark the tree's live model text as watched for ``seconds``: its model calls from the
        next one on are streamed, their text published on ``canopy_deltas``. For callers that
        LISTEN themselves; an API stream with deltas marks and renews its tree on its own."""
        async with self.db.tx() as conn:
            await views.require_tree(conn, scope, tree_id)
            await stream_watchers.watch(conn, tree_id, seconds)

    # -- directory and housekeeping (no actor is involved: plain committed writes) -------------------

    async def archive_root(self, scope: Scope, session_id: uuid.UUID, in_tx: TxHook | None = None) -> Row:
        """Hide an idle tree from lists (deletes nothing); Conflict while anything in it is busy."""
        async with self.db.tx() as conn:
            await trees.archive_root(conn, scope, session_id)
            session = await sessions.get_session(conn, scope, session_id)
            await _run_hook(in_tx, conn, session)
        return session

    async def set_title(self, scope: Scope, session_id: uuid.UUID, title: str, in_tx: TxHook | None = None) -> Row:
        async with self.db.tx() as conn:
            session = await sessions.set_title(conn, scope, session_id, title)
            await _run_hook(in_tx, conn, session)
        return session

    async def create_project(self, scope: Scope, name: str, in_tx: TxHook | None = None) -> Row:
        """A project; its workdir is derived under the data directory, never chosen by the caller."""
        async with self.db.tx() as conn:
            await quotas.check_room(conn, scope, "projects", self.settings.max_projects_per_scope)
            project = await projects.create_project(conn, scope, name, self.projects_root)
            await _run_hook(in_tx, conn, project)
        return project

    async def check_model(self, model: str, api_base: str | None = None, api_key_ref: str | None = None) -> str | None:
        """The gateway's word on a model (see ModelGateway.check_model): None, or what is missing."""
        problem: str | None = await gateways.call("check_model", model=model, api_base=api_base,
                                                  api_key_ref=api_key_ref)
        return problem

    async def default_model_problem(self) -> str | None:
        """What the default model (CANOPY_DEFAULT_MODEL) lacks, as a sentence naming it; None: nothing."""
        if problem := await self.check_model(self.settings.default_model):
            return f"the default model {self.settings.default_model!r} (CANOPY_DEFAULT_MODEL) cannot be used: {problem}"
        return None

    async def create_agent(self, scope: Scope, fields: dict[str, Any], in_tx: TxHook | None = None) -> Row:
        """Refused, with nothing written, unless the gateway can use its model, api_base and key."""
        check_tool_names(fields.get("tools") or [])
        await require_usable_model(self.check_model, fields)
        async with self.db.tx() as conn:
            await quotas.check_room(conn, scope, "agents", self.settings.max_agents_per_scope)
            agent = await agents.create_agent(conn, scope, fields)
            await _run_hook(in_tx, conn, agent)
        return agent

    async def update_agent(self, scope: Scope, agent_id: str, changes: dict[str, Any],
                           in_tx: TxHook | None = None) -> Row:
        """Only the owner edits; sessions created from the agent keep their frozen copy. An edit of
        the model, api_base or api_key_ref is checked like a new agent's (with the fields it keeps)."""
        check_tool_names(changes.get("tools") or [])
        checked = None
        if changes.keys() & set(agents.ENDPOINT_FIELDS):
            async with self.db.tx() as conn:
                current = await agents.get_own_agent(conn, scope, agent_id)
            checked = await require_usable_model(self.check_model, {**current, **changes})
        async with self.db.tx() as conn:
            agent = await agents.update_agent(conn, scope, agent_id, changes, checked_endpoint=checked)
            await _run_hook(in_tx, conn, agent)
        return agent

    async def create_api_key(self, scope: Scope) -> str:
        """A new API key for the scope (stored hashed; shown only here)."""
        async with self.db.tx() as conn:
            return await scopes.create_api_key(conn, scope)

    async def request_compaction(self, scope: Scope, session_id: uuid.UUID, in_tx: TxHook | None = None) -> Row:
        """Compact the session's history at its next model call (actors/compaction.py), whatever its size."""
        async with self.db.tx() as conn:
            asked = await sessions.request_compaction(conn, scope, session_id)
            await _run_hook(in_tx, conn, asked)
        return asked

    async def create_schedule(self, scope: Scope, session_id: uuid.UUID, rule: schedules.Rule, text: str,
                              catch_up: str = "once", in_tx: TxHook | None = None) -> Row:
        """Submit ``text`` to the session at each due time of ``rule`` (the sweeper fires it)."""
        async with self.db.tx() as conn:
            await quotas.check_room(conn, scope, "schedules", self.settings.max_schedules_per_scope)
            schedule = await schedules.create_schedule(conn, scope, session_id, rule, text, catch_up)
            await _run_hook(in_tx, conn, schedule)
        return schedule

    async def list_schedules(self, scope: Scope, session_id: uuid.UUID) -> list[Row]:
        async with self.db.tx() as conn:
            return await schedules.list_schedules(conn, scope, session_id)

    async def delete_schedule(self, scope: Scope, session_id: uuid.UUID, schedule_id: uuid.UUID) -> None:
        async with self.db.tx() as conn:
            await schedules.delete_schedule(conn, scope, session_id, schedule_id)

    @property
    def projects_root(self) -> Path:
        return self.settings.data_dir / "projects"

    # -- reading -----------------------------------------------------------------------------------

    async def result(self, scope: Scope, *, input_id: uuid.UUID | None = None,
                     turn_id: uuid.UUID | None = None) -> Row:
        async with self.db.tx() as conn:
            return await turns.get_result(conn, scope, input_id=input_id, turn_id=turn_id)

    async def wait_result(self, scope: Scope, input_id: uuid.UUID, timeout: float = 120.0,
                          poll_seconds: float = 0.1) -> Row:
        """Poll the durable result until the input is terminal (for tests, CLI and demos)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            result = await self.result(scope, input_id=input_id)
            if result["terminal"]:
                return result
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"input {input_id} is still {result['status']} after {timeout} s")
            await asyncio.sleep(poll_seconds)

    async def tree_summary(self, scope: Scope, tree_id: uuid.UUID) -> Row:
        async with self.db.tx() as conn:
            return await trees.tree_summary(conn, scope, tree_id)

    async def wait_tree_idle(self, scope: Scope, tree_id: uuid.UUID, timeout: float = 120.0) -> Row:
        """Poll until no member of the tree has an unfinished Turn or an unpaused queued input."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            summary = await self.tree_summary(scope, tree_id)
            if all(m["activity"] == Activity.IDLE and m["turn_status"] in (None, *TERMINAL_TURN_STATUSES)
                   for m in summary["members"]):
                return summary
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"tree {tree_id} is still busy after {timeout} s")
            await asyncio.sleep(0.1)
