"""The Docker sandbox: one long-lived, hardened container per tree.

- Named ``canopy-tree-<tree_id>`` and labelled ``canopy.managed=true``,
  ``canopy.tree_id=<tree_id>``: ``ensure`` re-adopts the container of that name (same
  container id), so a restarted runtime never makes a second one; a create that loses a
  race to another process adopts the winner's container. A container of that name without
  both labels (someone else's) is never adopted, used or removed: ``ensure`` refuses.
  A container built from other settings (label ``canopy.spec``, a digest of its spec: image,
  limits, user, mounts) is recreated, so changed settings and hardening reach old trees.
- Hardened: every capability dropped, ``no-new-privileges``, a read-only root filesystem,
  a non-root user (``SandboxOptions.user``), memory (no swap beyond it), CPU and pids limits,
  the highest OOM score adjustment (the kernel's first choice when the node runs out of memory),
  no log kept on the host (the ``none`` driver), and no network unless the options allow
  the host's. ``/tmp`` is a size-limited tmpfs, so it is lost when
  the container stops; the project workdir is bind-mounted read-write at ``/workspace`` (the
  working directory) and survives release. When the runtime is root, the workdir is handed
  to the sandbox user (``chown``), or the sandbox could not write it.
- At most ``SandboxOptions.max_containers`` managed containers run on one engine. Counting
  the running ones and creating/starting one happen under an exclusive ``flock`` on a file
  named after the engine's id in a private dir of the host's temp dir, so two claims on the
  host cannot both see room for one more (``flock`` locks belong to an open file, so two
  backend objects of one process exclude each other too). Runtimes of other Unix users, or
  on other hosts sharing a remote engine, hold other locks: their race may overshoot by one.
  A claim refused for room (``SandboxFull``) gets it from the manager when enough sandboxes are
  idle (``SandboxManager``: the least recently used go first).
- Commands run through ``docker exec`` wrapped in ``sh``: the wrapper starts the command
  with ``setsid`` (its own process group) and ``CANOPY_COMMAND_ID`` in its environment, and
  records the group id in ``/tmp/.canopy/<command id>.pid``. Killing a command (a
  cancellation here, or ``kill`` from any process) kills that group inside the container,
  then every process whose environment carries that command id: that command and nothing
  else. An exec outlives the client that started it, so ``kill`` works after that died.
  A ``kill`` also leaves a tombstone: a command of that id started afterwards (by a Run that
  lost its lease on its way to starting it) exits at once as killed (137), never running.
  Command ids are unique per Turn and call, and a killed one is never run again. The tombstone
  is an empty file ``<command id>.killed`` in a host directory of the tree's
  (``tombstones_dir``), which the container sees read-only: a restart of the container keeps it,
  and the sandbox user cannot remove it; a new container starts without any. A runtime that
  cannot write that directory (another user's, or one on another host of a remote engine)
  relies on the one the killer leaves in ``/tmp/.canopy`` too, which a restart empties.
- The search for processes that left the command's group forks, and so does every command: a
  container whose process limit is full (processes left behind by a command, a fork bomb) can
  neither be cleaned nor used. After a kill, and after any command that did not succeed, the
  engine's count of the container's processes is read; with fewer than ``_FORK_ROOM`` left, the
  container is restarted (once, however many saw it full), which stops every process in it. The
  workdir and the tombstones stay; ``/tmp`` goes (the mark of a cancellation that asked for the
  restart is written again). The commands this backend was running or starting in it are told
  so in their results.

The image needs ``sh``, ``setsid``, ``kill``, ``cat``, ``mkdir``, ``sleep``, ``tr``, ``grep``
(busybox or coreutils + util-linux + grep). ``.ci/docker-up.sh`` builds a busybox image offline.
Without an engine answering, every call raises ``SandboxUnavailable`` (the client connects on
first use, so a runtime starts and says so only when a sandbox is needed).

An exec's output is read from the buffered file the HTTP client read its reply's headers through
(``sandbox/docker_compat.py``), not from the socket beneath, which docker-py hands back: output that
came in with the headers sits in that file, and was lost. An end of the stream inside a frame is a
stream cut short, like a failed read.

Blocking SDK calls run in threads. Output streams get a dedicated thread pool because
each one occupies a thread for the whole command; the loop's default executor (a few
threads) would otherwise cap the number of concurrent commands. The pool has a thread for every
slot of every container the node may run (``Settings.sandbox_stream_threads``): a command waiting
for one has not started while its timeout runs, and one tree's long commands must not make
another's wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import docker
import docker.errors
from docker.models.containers import Container
from docker.utils.socket import STDERR, STDOUT

from persistence.settings import get_settings
from sandbox.base import (
    FLOODED,
    KILLED_EXIT_CODE,
    OOM_SCORE_ADJ,
    CappedOutput,
    CommandResult,
    SandboxError,
    SandboxFull,
    SandboxGone,
    SandboxOptions,
    SandboxUnavailable,
    check_command_id,
    parse_user,
    private_dir,
    tree_id_or_none,
)
from sandbox.docker_compat import ExecOutput, exec_output
from sandbox.images import build_hint

log = logging.getLogger(__name__)

LABEL_TREE = "canopy.tree_id"
LABEL_MANAGED = "canopy.managed"
LABEL_SPEC = "canopy.spec"
WORKSPACE = "/workspace"
NETWORK_MODES = ("none", "host")
_STATE_DIR = "/tmp/.canopy"
# Where the container sees its tree's tombstones (read-only): a host directory, ``tombstones_dir``.
TOMBSTONES = "/.canopy-killed"
_CUT_SHORT = ("\n[canopy: the command's output was cut short (its connection to the container engine broke): "
              "what it printed may be incomplete; a command still running then was stopped]")
# After a kill, how long to keep reading an exec stream an escaped process may hold open.
_DRAIN_SECONDS = 2.0
_PING_TIMEOUT_SECONDS = 3
# Processes the killer needs at once (its shell and a pipeline); fewer free means the container is full.
_FORK_ROOM = 4
_RESTARTED = ("\n[canopy: the sandbox's process limit ({limit}) was full, so it was restarted, which stopped "
              "every process in it (this command too, if it still ran). The workdir is kept; $CANOPY_TMP "
              "was emptied]")
_LIVE_STATES = ["running", "restarting", "paused"]

# $1 = command id, $2 = the command. The inner shell is a session leader (setsid), so its pid
# is the group id it writes down; it then checks for a cancellation or a kill that came before
# the pid file existed (a ``.cancel`` mark, or the id's tombstone, in ``/tmp`` or on the host),
# and becomes the command (exec). The outer shell stays to clean up (the pid file and the mark,
# never a tombstone) and does not carry the command id, so a kill leaves it to report the exit.
# `; rc=$?` keeps the outer shell from exec-ing setsid itself: an exec'd process leads its
# group, and setsid would then fork and exit at once, losing the exit code.
_WRAPPER = f"""d={_STATE_DIR}; mkdir -p "$d"
CANOPY_COMMAND_ID="$1" setsid sh -c \\
    'echo $$ > "$0.pid"; if [ -e "$0.cancel" ] || [ -e "$0.killed" ] || [ -e "$2" ]; then exit {KILLED_EXIT_CODE}; fi
    exec sh -c "$1"' "$d/$1" "$2" "{TOMBSTONES}/$1.killed"
rc=$?; rm -f "$d/$1.pid" "$d/$1.cancel"; exit $rc"""

# $1 = command id, $2 = "cancel" or "kill". Both come after a mark, so a wrapper that has not
# written its pid exits instead of starting (it writes its pid, then looks for the mark; the
# killer leaves the mark, then looks for the pid: one of them sees the other's). A cancellation
# (by the process that started the command, which may not have started yet) leaves ``.cancel``
# and waits briefly for the pid file; the wrapper deletes that mark when it ends. A kill (from
# anywhere, maybe before a Run that lost its lease starts that command) leaves ``.killed``, a
# tombstone no one deletes: every later start of that id exits at once, killed. (The backend has
# left one on the host before, where it can: ``_leave_tombstone``.)
# Then: kill the group, and every process whose environment carries the command id (children
# that left the group), in rounds, since a dying shell may still fork. Exit 0 iff one was found.
_KILLER = f"""d={_STATE_DIR}; rc=1; i=0
mkdir -p "$d"
if [ "$2" = cancel ]; then
    touch "$d/$1.cancel"
    while [ ! -s "$d/$1.pid" ] && [ -e "$d/$1.cancel" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
else
    touch "$d/$1.killed"
fi
[ -s "$d/$1.pid" ] && kill -KILL -"$(cat "$d/$1.pid")" 2>/dev/null && rc=0
i=0
while [ $i -lt 20 ]; do
    found=
    for e in /proc/[0-9]*/environ; do
        tr '\\0' '\\n' <"$e" 2>/dev/null | grep -qxF "CANOPY_COMMAND_ID=$1" || continue
        p=${{e#/proc/}}; kill -KILL "${{p%/environ}}" 2>/dev/null && found=1
    done
    [ -z "$found" ] && break
    rc=0; i=$((i+1)); sleep 0.05
done
exit $rc"""


def container_name(tree_id: uuid.UUID) -> str:
    return f"canopy-tree-{tree_id}"


def tombstones_dir(tree_id: uuid.UUID) -> Path:
    """The host directory of a tree's tombstones, an empty file ``<command id>.killed`` per killed
    command (the suffix: ids ``.`` and ``..`` are valid), mounted read-only at ``TOMBSTONES``. It
    lives as long as the tree's container: a restart of the container (its process limit full, or
    the engine's) empties ``/tmp`` but keeps them, and the orphan sweep removes the directory of a
    container removed outside Canopy (``remove_leftovers``). The sandbox user reads it (0755), only Canopy's
    user writes it; its parent is this user's alone (0700), so no other user lists the trees."""
    return _tombstones_parent() / str(tree_id)


def _tombstones_parent() -> Path:
    """The directory of every tree's tombstones directory: this user's, in the shared temp dir."""
    return Path(tempfile.gettempdir()) / f"canopy-sandbox-killed-{os.geteuid()}"


def _our_tombstones_dir(tree_id: uuid.UUID) -> Path:
    """``tombstones_dir``, its parent first checked to be this user's private directory (made if
    missing): a parent another user planted in the shared temp dir (a symlink, say) is never
    followed, to write or to delete (``SandboxError``)."""
    private_dir(_tombstones_parent())
    return tombstones_dir(tree_id)


def connect(max_pool_size: int = 64) -> docker.DockerClient:
    """A client of the engine ``DOCKER_HOST`` (or the default socket) names, once it answers a ping."""
    try:
        probe = docker.from_env(timeout=_PING_TIMEOUT_SECONDS)
        try:
            probe.ping()
        finally:
            probe.close()
        return docker.from_env(timeout=60, max_pool_size=max_pool_size)
    except (docker.errors.DockerException, OSError) as error:
        raise SandboxUnavailable(
            f"no Docker engine answers ({error}): start Docker or point DOCKER_HOST at this machine's, or set "
            "CANOPY_SANDBOX_BACKEND=local to run commands on this host as the Canopy user, WITHOUT isolation"
        ) from error


@dataclasses.dataclass(eq=False)  # in sets, by identity
class _Exec:
    """One running ``docker exec``: its id, its output so far, and its stream (to cut)."""

    exec_id: str
    handle: str
    command_id: str
    stdout: CappedOutput = dataclasses.field(default_factory=CappedOutput)
    stderr: CappedOutput = dataclasses.field(default_factory=CappedOutput)
    output: ExecOutput | None = None
    restarted_at_limit: int = 0  # the container was restarted under it, its process limit full
    cut: bool = False  # Canopy stopped listening (after a kill): the stream's end is its own
    broken: bool = False  # the stream failed under the reader, not cut by Canopy


class DockerBackend:
    name = "docker"

    def __init__(self, client: docker.DockerClient | None = None, *, max_commands: int | None = None) -> None:
        self._client = client
        self._client_lock = threading.Lock()
        self._max_commands = max_commands or get_settings().sandbox_stream_threads
        self._streams = ThreadPoolExecutor(max_workers=self._max_commands, thread_name_prefix="canopy-exec")
        self._engine: dict[str, Any] | None = None
        self._running: dict[str, set[_Exec]] = {}  # by container: the commands a restart would stop
        self._restarting: dict[str, threading.Lock] = {}  # by container
        self._running_lock = threading.Lock()

    @property
    def client(self) -> docker.DockerClient:
        """The engine's client, connected on first use; raises ``SandboxUnavailable`` without an engine."""
        with self._client_lock:
            if self._client is None:
                self._client = connect(self._max_commands)
            return self._client

    def close(self) -> None:
        self._streams.shutdown(wait=False, cancel_futures=True)
        with self._client_lock:
            if self._client is not None:
                self._client.close()

    def _engine_info(self) -> dict[str, Any]:
        if self._engine is None:
            self._engine = self.client.info()
        return self._engine

    # -- lifecycle -------------------------------------------------------------------

    async def ensure(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        return await asyncio.to_thread(self._ensure_sync, tree_id, workdir, options)

    def _ensure_sync(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        workdir = workdir.resolve()
        spec = self._container_spec(tree_id, workdir, options)  # asks the engine first: no engine, no change
        name = container_name(tree_id)
        container = self._find(name)
        if container is not None:
            _check_ours(container, tree_id)
        workdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(workdir, *parse_user(options.user))
        if container is not None:
            if container.labels.get(LABEL_SPEC) != spec["labels"][LABEL_SPEC]:
                log.warning("sandbox %s was built from other settings or for another workdir; recreating it", name)
                self._remove(container)
                container = None
        if container is not None and container.status == "running":
            return str(container.id)
        if container is None:
            self._pull_if_missing(options.image)
        with self._host_lock():
            # Looked up again: another claim may have made or started it while we waited.
            container = self._find(name)
            if container is not None:
                _check_ours(container, tree_id)
                if container.status == "running":
                    return str(container.id)
            self._check_room(options.max_containers)
            created = container is None
            # After a removal, which drops it (the engine would make a missing one, root's), and
            # only for a container about to be made or started: a refused one leaves none behind.
            tombstones = _make_tombstones_dir(tree_id)
            if container is None:
                try:
                    container = self._create(tree_id, options.image, spec)
                except SandboxError:
                    shutil.rmtree(tombstones, ignore_errors=True)
                    raise
            # Exited, e.g. after an engine restart: start it again (same id; /tmp starts empty).
            self._start(container, remove_on_failure=created)
            return str(container.id)

    def _find(self, name_or_id: str) -> Container | None:
        try:
            return self.client.containers.get(name_or_id)
        except docker.errors.NotFound:
            return None

    @contextlib.contextmanager
    def _host_lock(self) -> Iterator[None]:
        directory = private_dir(Path(tempfile.gettempdir()) / f"canopy-sandbox-locks-{os.geteuid()}")
        engine = re.sub(r"[^A-Za-z0-9_-]", "_", str(self._engine_info().get("ID") or "engine"))
        fd = os.open(directory / f"containers-{engine}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the lock

    def _check_room(self, limit: int) -> None:
        live = self.client.api.containers(
            quiet=True, filters={"label": f"{LABEL_MANAGED}=true", "status": _LIVE_STATES}
        )
        if len(live) >= limit:
            raise SandboxFull(
                f"{len(live)} sandbox containers already run on this Docker engine, the limit of {limit} "
                "(CANOPY_SANDBOX_MAX_CONTAINERS), and not enough of them are idle to make room; wait until "
                "commands end, or raise the limit",
                len(live) - limit + 1,
            )

    def _pull_if_missing(self, image: str) -> None:
        try:
            self.client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            log.info("sandbox image %s missing; pulling it", image)
        try:
            self.client.images.pull(image)
        except docker.errors.APIError as error:
            raise SandboxError(
                f"sandbox image {image} is not present and cannot be pulled ({error.explanation}): "
                f"{build_hint(image)}"
            ) from error

    def _create(self, tree_id: uuid.UUID, image: str, spec: dict[str, Any]) -> Container:
        name = container_name(tree_id)
        try:
            return self.client.containers.create(image, name=name, **spec)
        except docker.errors.ImageNotFound as error:
            raise SandboxError(f"sandbox image {image} vanished while creating {name}; try again") from error
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise SandboxError(
                    f"could not create the sandbox container {name}: {error.explanation}"
                ) from error
            # Made by a process that holds another lock (another user, another host): adopt it if ours.
            adopted = self._find(name)
            if adopted is None:
                raise SandboxError(f"sandbox container {name} conflicts but cannot be found") from error
            _check_ours(adopted, tree_id)
            return adopted

    def _start(self, container: Container, remove_on_failure: bool) -> None:
        try:
            container.start()
        except docker.errors.APIError as error:
            if remove_on_failure:
                self._remove(container)
            raise SandboxError(
                f"could not start the sandbox container {container.name}: {error.explanation}"
            ) from error

    def _container_spec(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> dict[str, Any]:
        if parse_user(options.user)[0] == 0:
            raise SandboxError("sandbox commands never run as root; set CANOPY_SANDBOX_USER to a non-root uid:gid")
        if options.network not in NETWORK_MODES:
            raise SandboxError(f"sandbox network {options.network!r} is not one of {', '.join(NETWORK_MODES)}")
        spec: dict[str, Any] = {
            "command": ["sleep", "infinity"],
            "init": True,
            "working_dir": WORKSPACE,
            "volumes": {str(workdir): {"bind": WORKSPACE, "mode": "rw"},
                        str(tombstones_dir(tree_id)): {"bind": TOMBSTONES, "mode": "ro"}},
            "environment": {
                "CANOPY_TMP": "/tmp",
                "CANOPY_TREE_ID": str(tree_id),
                "CANOPY_SANDBOX": "docker",
                # The root filesystem is read-only: /tmp is the one writable place besides /workspace.
                "HOME": "/tmp",
            },
            "user": options.user,
            "network_mode": options.network,
            "mem_limit": options.memory,
            # As much swap again, without it (the engine's default): the memory limit is the limit.
            "memswap_limit": options.memory,
            "nano_cpus": int(min(options.cpus, self._cpu_ceiling()) * 1e9),
            "pids_limit": options.pids,
            "oom_score_adj": OOM_SCORE_ADJ,  # inherited by every process exec'd in the container
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={options.tmp_size},mode=1777"},
            # No log: a command can write to pid 1's stdout (/proc/1/fd/1), and the engine's default
            # driver keeps all of it in a file on the host, without bound. Canopy never reads it.
            "log_config": {"type": "none", "config": {}},
        }
        # A container made before the workdir's disk image was mounted binds the directory beneath it
        # (sandbox/workdirs.py): it must be made again to see the workdir. Only then does the digest
        # change, so the containers of workdirs without a disk are kept across the upgrade.
        mounted = ["workdir disk"] if os.path.ismount(workdir) else []
        digest = hashlib.sha256(json.dumps([options.image, spec, *mounted], sort_keys=True).encode()).hexdigest()[:16]
        spec["labels"] = {LABEL_TREE: str(tree_id), LABEL_MANAGED: "true", LABEL_SPEC: digest}
        return spec

    def _cpu_ceiling(self) -> float:
        # The engine refuses a CPU quota above its own CPU count.
        return float(self._engine_info().get("NCPU") or 1)

    def _find_managed(self, handle: str) -> Container | None:
        # A handle comes from the database: never act on a container Canopy did not make.
        container = self._find(handle)
        if container is None or container.labels.get(LABEL_MANAGED) != "true":
            return None
        return container

    async def exists(self, handle: str) -> bool:
        container = await asyncio.to_thread(self._find_managed, handle)
        return container is not None and container.status == "running"

    async def fits(self, handle: str, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> bool:
        return await asyncio.to_thread(self._fits_sync, handle, tree_id, workdir, options)

    def _fits_sync(self, handle: str, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> bool:
        container = self._find_managed(handle)
        if container is None or container.status != "running":
            return False
        spec = self._container_spec(tree_id, workdir.resolve(), options)
        return container.labels == {**container.labels, **spec["labels"]}

    async def release(self, handle: str) -> None:
        with self._running_lock:
            self._restarting.pop(handle, None)
        container = await asyncio.to_thread(self._find_managed, handle)
        if container is not None:
            await asyncio.to_thread(self._remove, container)

    def _remove(self, container: Container) -> None:
        # force: SIGKILL and remove in one call; the bind-mounted workdir is not touched.
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as error:
            if "already in progress" not in str(error.explanation):
                raise
            self._wait_gone(str(container.id))
        # No command can start in it any more, and a new sandbox starts without tombstones.
        tree_id = tree_id_or_none(container.labels.get(LABEL_TREE))
        if tree_id is not None:
            with contextlib.suppress(SandboxError):  # a planted parent: nothing of ours to delete
                shutil.rmtree(_our_tombstones_dir(tree_id), ignore_errors=True)

    def _wait_gone(self, container_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self._find(container_id) is not None:
            if time.monotonic() > deadline:
                raise SandboxError(f"sandbox container {container_id} is still being removed")
            time.sleep(0.1)

    async def sandboxes(self) -> dict[str, uuid.UUID]:
        return await asyncio.to_thread(self._managed_containers)

    async def remove_leftovers(self) -> int:
        return await asyncio.to_thread(self._remove_orphan_tombstones)

    def _remove_orphan_tombstones(self) -> int:
        """Remove the tombstones directories of trees with no container on this engine, left by a
        container removed outside Canopy or by a process that died between a container's removal and
        its directory's. Under the host lock: a claim makes a directory and its container under it,
        so a directory without a container then is a leftover, never one about to be used."""
        parent = _tombstones_parent()
        if not parent.is_dir():
            return 0
        with self._host_lock():
            private_dir(parent)  # a planted parent is never followed (SandboxError)
            live = set(self._managed_containers().values())
            leftovers = [entry for entry in parent.iterdir()
                         if (tree_id := tree_id_or_none(entry.name)) is not None and tree_id not in live]
            for entry in leftovers:
                shutil.rmtree(entry, ignore_errors=True)
        return len(leftovers)

    def _listed(self, label: str) -> list[dict[str, Any]]:
        """Every container (running or not) with ``label``, as the engine lists them: one request.
        (docker-py's ``containers.list`` inspects each listed container in turn, and fails on one
        removed meanwhile, by a release or another sweeper.)"""
        listed: list[dict[str, Any]] = self.client.api.containers(all=True, filters={"label": label})
        return listed

    def _managed_containers(self) -> dict[str, uuid.UUID]:
        trees = {str(found["Id"]): tree_id_or_none((found.get("Labels") or {}).get(LABEL_TREE))
                 for found in self._listed(f"{LABEL_MANAGED}=true")}
        return {handle: tree_id for handle, tree_id in trees.items() if tree_id is not None}

    def containers_for(self, tree_id: uuid.UUID) -> list[str]:
        """Ids of every container (running or not) labelled with this tree: at most one."""
        return [str(found["Id"]) for found in self._listed(f"{LABEL_TREE}={tree_id}")]

    # -- commands --------------------------------------------------------------------

    async def run(self, handle: str, command: str, timeout_seconds: float, command_id: str) -> CommandResult:
        check_command_id(command_id)
        execution = _Exec("", handle, command_id)
        with self._running_lock:  # before the exec exists: a restart meanwhile must tell it too
            self._running.setdefault(handle, set()).add(execution)
        try:
            execution.exec_id = await asyncio.to_thread(self._exec_create, handle, command_id, command)
            return await self._follow(execution, timeout_seconds)
        finally:
            with self._running_lock:
                running = self._running[handle]
                running.discard(execution)
                if not running:
                    del self._running[handle]

    async def _follow(self, execution: _Exec, timeout_seconds: float) -> CommandResult:
        stream = asyncio.get_running_loop().run_in_executor(self._streams, self._pump, execution)
        try:
            await asyncio.wait_for(asyncio.shield(stream), timeout_seconds)
        except TimeoutError:
            await self._cancel(execution.handle, execution.exec_id, execution.command_id)
            await self._drain(stream, execution)
            return await self._result(execution, timed_out=True)
        except asyncio.CancelledError:
            # Kill that command's group before the cancellation goes on; shielded so that a
            # second cancel cannot leave it running.
            await asyncio.shield(self._cancel(execution.handle, execution.exec_id, execution.command_id))
            raise
        return await self._result(execution, timed_out=False)

    def _exec_create(self, handle: str, command_id: str, command: str) -> str:
        try:
            created = self.client.api.exec_create(
                handle, ["sh", "-c", _WRAPPER, "canopy", command_id, command], workdir=WORKSPACE
            )
        except docker.errors.NotFound as error:
            raise SandboxGone(f"sandbox container {handle} no longer exists") from error
        except docker.errors.APIError as error:
            if error.status_code == 409:  # container exists but is not running
                raise SandboxGone(f"sandbox container {handle} is not running") from error
            raise SandboxError(
                f"could not start a command in sandbox {handle}: {error.explanation}"
            ) from error
        return str(created["Id"])

    def _pump(self, execution: _Exec) -> None:
        """Read the multiplexed exec stream to its end (runs in a stream thread)."""
        output = execution.output = exec_output(self.client.api, execution.exec_id)
        if execution.cut:  # cut while the exec was starting, before there was anything to cut
            output.cut()
        sinks = {STDOUT: execution.stdout, STDERR: execution.stderr}
        try:
            for stream_id, data in _frames(output.reader):
                if sinks.get(stream_id, execution.stderr).feed(data):
                    # Not in the stream pool: every thread of it may be reading a stream meanwhile.
                    threading.Thread(target=self._stop_flood, args=(execution,), name="canopy-flood-stop",
                                     daemon=True).start()
        except (OSError, ValueError, EOFError):  # ValueError: read after the cut closed it
            execution.broken = not execution.cut
        finally:
            output.close()

    def _stop_flood(self, execution: _Exec) -> None:
        """Kill a command whose output passed the ceiling, in a thread of its own while the stream's
        reads on to its end (the kill's). A reader that stopped first would close the stream, and a
        command writing to it would die of SIGPIPE and go on to its next step; one that waited for
        the kill held it up (the engine started the killer's exec only once the command had timed
        out, its stdout unread meanwhile)."""
        try:
            self._run_killer(execution.handle, execution.command_id, "cancel")
        except docker.errors.APIError as error:
            log.info("sandbox %s: kill of flooding command %s failed: %s", execution.handle,
                     execution.command_id, error.explanation)

    async def _drain(self, stream: asyncio.Future[None], execution: _Exec) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(stream), _DRAIN_SECONDS)
        except TimeoutError:
            # A process that escaped the group still holds the output open: stop listening.
            execution.cut = True
            if execution.output is not None:
                execution.output.cut()

    async def _result(self, execution: _Exec, timed_out: bool) -> CommandResult:
        exit_code = await asyncio.to_thread(self._exit_code, execution.exec_id)
        stderr = execution.stderr.text()
        # A stream that failed, or ended while the command runs on, was cut short by something
        # else than Canopy (its connection to the engine): the output read is not the whole one,
        # and the command must not run on unsupervised. One that flooded was stopped by Canopy.
        flooded = execution.stdout.flooded or execution.stderr.flooded
        if not timed_out and (execution.broken or flooded or exit_code is None):
            if exit_code is None:
                await self._cancel(execution.handle, execution.exec_id, execution.command_id)
            stderr += FLOODED if flooded else _CUT_SHORT
        if exit_code != 0:
            await asyncio.to_thread(self._restart_if_full, execution.handle)
        if execution.restarted_at_limit:
            stderr += _RESTARTED.format(limit=execution.restarted_at_limit)
        return CommandResult(KILLED_EXIT_CODE if exit_code is None else exit_code, execution.stdout.text(),
                             stderr, timed_out)

    def _restart_if_full(self, handle: str) -> bool:
        """Restart the container when its process limit leaves no room to fork, and tell the commands
        this backend runs in it; True if it did. Best effort: a container gone, or an engine that
        does not answer, is left to the next claim. (A restart by another process, or by a kill from
        one, is not told to this one's commands.)"""
        with self._running_lock:
            restarting = self._restarting.setdefault(handle, threading.Lock())
        # Held from the count to the restart: two threads that both saw it full restart it once.
        with restarting:
            try:
                limit = self.client.api.inspect_container(handle)["HostConfig"].get("PidsLimit")
                if not limit or limit < 0:
                    return False
                # One row per thread: threads count against the limit too. (The engine's stats call
                # says it in one number, but waits for its next sample, up to a second, when asked
                # twice.) -e: an engine whose ps refuses its pid list lists them all, then picks.
                rows = self.client.api.top(handle, ps_args="-eL -o pid")["Processes"] or ()  # None: restarting
                if limit - len(rows) >= _FORK_ROOM:
                    return False
                log.warning("sandbox %s: %d of %d processes, no room to fork; restarting it", handle, len(rows),
                            limit)
                with self._running_lock:
                    for execution in self._running.get(handle, ()):
                        execution.restarted_at_limit = limit
                self.client.api.restart(handle, timeout=0)
                return True
            except (docker.errors.DockerException, OSError) as error:  # requests' errors are OSErrors
                log.warning("sandbox %s: process count or restart failed: %s", handle, error)
                return False

    def _exit_code(self, exec_id: str, wait_seconds: float = 2.0) -> int | None:
        """The exec's exit code; None while it still runs after ``wait_seconds``."""
        # The stream can end a moment before the engine records the exit.
        deadline = time.monotonic() + wait_seconds
        while True:
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    async def _cancel(self, handle: str, exec_id: str, command_id: str) -> None:
        try:
            await asyncio.to_thread(self._cancel_sync, handle, exec_id, command_id)
        except docker.errors.APIError as error:
            # The container is gone or stopped: its processes are gone with it.
            log.info("sandbox %s: kill of command %s skipped: %s", handle, command_id, error.explanation)

    def _cancel_sync(self, handle: str, exec_id: str, command_id: str) -> None:
        if self.client.api.exec_inspect(exec_id).get("ExitCode") is not None:
            return  # it finished on its own just now: nothing to kill, no mark to leave behind
        self._run_killer(handle, command_id, "cancel")

    async def kill(self, handle: str, command_id: str) -> bool:
        check_command_id(command_id)
        try:
            return await asyncio.to_thread(self._kill_sync, handle, command_id)
        except docker.errors.APIError as error:
            log.info("sandbox %s: nothing to kill for command %s: %s", handle, command_id, error.explanation)
            return False  # the container is gone or stopped, and its processes with it

    def _kill_sync(self, handle: str, command_id: str) -> bool:
        container = self._find_managed(handle)
        if container is None:
            return False
        _leave_tombstone(container, command_id)
        return self._run_killer(handle, command_id, "kill")

    def _run_killer(self, handle: str, command_id: str, mode: str) -> bool:
        killer = self.client.api.exec_create(handle, ["sh", "-c", _KILLER, "canopy-kill", command_id, mode])
        self.client.api.exec_start(killer["Id"])
        found = self._exit_code(killer["Id"]) == 0
        if not self._restart_if_full(handle):
            return found
        # The restart emptied /tmp: the mark again, lest a start of that id still on its way runs it.
        self._run_killer(handle, command_id, mode)
        return True


def _leave_tombstone(container: Container, command_id: str) -> None:
    """The id's tombstone in the directory the container mounts, before the killer runs: a start
    the killer misses sees it, even in a container too full to fork the killer, and a restart
    keeps it. Only where that directory is this user's on this host (a runtime of another user,
    or on another host of a remote engine, relies on the killer's tombstone in ``/tmp``)."""
    sources = [mount.get("Source") for mount in container.attrs.get("Mounts") or ()
               if mount.get("Destination") == TOMBSTONES]
    tree_id = tree_id_or_none(container.labels.get(LABEL_TREE))
    if tree_id is None or sources != [str(tombstones_dir(tree_id))]:
        return
    with contextlib.suppress(OSError, SandboxError):  # the killer's tombstone in /tmp stands
        (_our_tombstones_dir(tree_id) / f"{command_id}.killed").touch()


def _make_tombstones_dir(tree_id: uuid.UUID) -> Path:
    return private_dir(_our_tombstones_dir(tree_id), mode=0o755)


def _check_ours(container: Container, tree_id: uuid.UUID) -> None:
    """Refuse a container Canopy did not make for this tree (it only squats on the name)."""
    labels = container.labels
    if labels.get(LABEL_MANAGED) != "true" or labels.get(LABEL_TREE) != str(tree_id):
        raise SandboxError(
            f"a container named {container.name} exists, but Canopy did not make it for tree {tree_id} "
            f"(labels {LABEL_MANAGED}=true and {LABEL_TREE}={tree_id} missing); it was left untouched: "
            "remove or rename it, then try again"
        )


def _frames(reader: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """The (stream, bytes) frames of an exec's multiplexed output, as they come. The engine ends the
    stream between two frames: an end inside one is a stream cut short (``EOFError``)."""
    read_some = getattr(reader, "read1", reader.read)
    while header := _read_exactly(reader, 8):
        stream_id, length = struct.unpack(">BxxxL", header)
        while length:
            data = read_some(min(length, 1 << 16))
            if not data:
                raise EOFError(f"the stream ended {length} bytes before its frame's end")
            length -= len(data)
            yield stream_id, data


def _read_exactly(reader: BinaryIO, size: int) -> bytes:
    """``size`` bytes, or none at the stream's end."""
    data = b""
    while len(data) < size and (more := reader.read(size - len(data))):
        data += more
    if data and len(data) < size:
        raise EOFError(f"the stream ended {size - len(data)} bytes before its frame's header's end")
    return data
