"""The Docker sandbox: one long-lived container per tree.

- Named ``canopy-tree-<tree_id>`` and labelled ``canopy.tree_id=<tree_id>``: ``ensure`` finds
  an existing container by that name and re-adopts it (same container id), so a restarted
  runtime never makes a second one; a create that loses a race to another process adopts
  the winner's container.
- The project workdir is bind-mounted at ``/workspace`` (the working directory), so it
  survives release; ``/tmp``, ``/root`` and every process live in the container and go
  with it.
- ``network_mode="none"`` unless the options allow network (then ``"host"``); memory,
  CPU and pids limits; ``init=True`` so orphaned background processes are reaped.
- Commands run through ``docker exec`` wrapped in ``sh``: the wrapper starts the command
  with ``setsid`` (its own process group) and records the group id in
  ``/tmp/.canopy/<command id>.pid``, so a cancellation can ``kill -KILL -<pgid>`` inside
  the container — that command's group and nothing else.

The image needs ``sh``, ``setsid``, ``kill``, ``cat``, ``mkdir``, ``sleep`` (busybox or
coreutils + util-linux). ``.ci/docker-up.sh`` builds a busybox image offline.

Blocking SDK calls run in threads. Output streams get a dedicated thread pool because
each one occupies a thread for the whole command; the loop's default executor (a few
threads) would otherwise cap the number of concurrent commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.utils.socket import STDERR, STDOUT, frames_iter

from sandbox.base import (
    DEFAULT_TIMEOUT_SECONDS,
    SIGNAL_EXIT_BASE,
    CappedOutput,
    CommandResult,
    SandboxError,
    SandboxGone,
    SandboxOptions,
    tree_id_or_none,
)

log = logging.getLogger(__name__)

LABEL_TREE = "canopy.tree_id"
LABEL_MANAGED = "canopy.managed"
WORKSPACE = "/workspace"
_STATE_DIR = "/tmp/.canopy"
_KILLED_EXIT_CODE = SIGNAL_EXIT_BASE + 9
# After a kill, how long to keep reading an exec stream an escaped process may hold open.
_DRAIN_SECONDS = 2.0

# $1 = command id, $2 = the command. The inner shell is a session leader (setsid), so its pid
# is the group id it writes down; it then checks for a cancellation that came before the
# pid file existed, and becomes the command (exec). The outer shell stays to clean up.
# `; rc=$?` keeps the outer shell from exec-ing setsid itself: an exec'd process leads its
# group, and setsid would then fork and exit at once, losing the exit code.
_WRAPPER = f"""d={_STATE_DIR}; mkdir -p "$d"
setsid sh -c 'echo $$ > "$0.pid"; [ -e "$0.cancel" ] && exit {_KILLED_EXIT_CODE}; exec sh -c "$1"' \\
    "$d/$1" "$2"
rc=$?; rm -f "$d/$1.pid" "$d/$1.cancel"; exit $rc"""

# $1 = command id. Mark the command cancelled first (so a wrapper that has not written its
# pid yet exits instead of starting), then kill the group once the pid file shows up. The
# wrapper deletes the mark when it ends, so a wrapper that already finished stops the wait.
_KILLER = f"""d={_STATE_DIR}; mkdir -p "$d"; touch "$d/$1.cancel"; i=0
while [ ! -s "$d/$1.pid" ] && [ -e "$d/$1.cancel" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
[ -s "$d/$1.pid" ] && kill -KILL -"$(cat "$d/$1.pid")" 2>/dev/null; exit 0"""


def container_name(tree_id: uuid.UUID) -> str:
    return f"canopy-tree-{tree_id}"


@dataclasses.dataclass
class _Exec:
    """One running ``docker exec``: its id, its output so far, and the socket to cut."""

    exec_id: str
    stdout: CappedOutput = dataclasses.field(default_factory=CappedOutput)
    stderr: CappedOutput = dataclasses.field(default_factory=CappedOutput)
    sock: Any = None


class DockerBackend:
    name = "docker"

    def __init__(self, client: docker.DockerClient | None = None, *, max_commands: int = 64) -> None:
        self.client = client or docker.from_env(timeout=60, max_pool_size=max_commands)
        self._streams = ThreadPoolExecutor(max_workers=max_commands, thread_name_prefix="canopy-exec")
        self._engine_cpus: float | None = None

    def close(self) -> None:
        self._streams.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    # -- lifecycle -------------------------------------------------------------------

    async def ensure(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        return await asyncio.to_thread(self._ensure_sync, tree_id, workdir, options)

    def _ensure_sync(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        container = self._find(container_name(tree_id))
        if container is not None and _workspace_source(container) != str(workdir):
            # The project moved: a sandbox must mount the workdir the tree uses now.
            log.warning("sandbox %s mounts another workdir; recreating it", container.name)
            self._remove(container)
            container = None
        if container is None:
            container = self._create(tree_id, workdir, options)
        if container.status != "running":
            # Exited, e.g. after an engine restart: start it again, same id, /tmp was kept.
            container.start()
        return str(container.id)

    def _find(self, name_or_id: str) -> Container | None:
        try:
            return self.client.containers.get(name_or_id)
        except docker.errors.NotFound:
            return None

    def _create(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> Container:
        name = container_name(tree_id)
        spec = self._container_spec(tree_id, workdir, options)
        try:
            return self._create_pulling(options.image, name, spec)
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise SandboxError(
                    f"could not create the sandbox container {name}: {error.explanation}"
                ) from error
            # Another process created it between our lookup and our create: adopt theirs.
            adopted = self._find(name)
            if adopted is None:
                raise SandboxError(f"sandbox container {name} conflicts but cannot be found") from error
            return adopted

    def _create_pulling(self, image: str, name: str, spec: dict[str, Any]) -> Container:
        try:
            return self.client.containers.create(image, name=name, **spec)
        except docker.errors.ImageNotFound:
            log.info("sandbox image %s missing; pulling it", image)
            try:
                self.client.images.pull(image)
            except docker.errors.APIError as error:
                raise SandboxError(
                    f"sandbox image {image} is not present and cannot be pulled ({error.explanation}); "
                    "build it with .ci/docker-up.sh or set CANOPY_SANDBOX_IMAGE"
                ) from error
            return self.client.containers.create(image, name=name, **spec)

    def _container_spec(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> dict[str, Any]:
        user = _container_user(options)
        return {
            "command": ["sleep", "infinity"],
            "init": True,
            "labels": {LABEL_TREE: str(tree_id), LABEL_MANAGED: "true"},
            "working_dir": WORKSPACE,
            "volumes": {str(workdir): {"bind": WORKSPACE, "mode": "rw"}},
            "environment": {
                "CANOPY_TMP": "/tmp",
                "CANOPY_TREE_ID": str(tree_id),
                "CANOPY_SANDBOX": "docker",
                # A non-root user has no home in the image: /tmp is writable and as disposable.
                "HOME": "/tmp" if user else "/root",
            },
            "user": user or "",
            "network_mode": "host" if options.network else "none",
            "mem_limit": options.memory,
            "nano_cpus": int(min(options.cpus, self._cpu_ceiling()) * 1e9),
            "pids_limit": options.pids,
            "security_opt": ["no-new-privileges"],
        }

    def _cpu_ceiling(self) -> float:
        # The engine refuses a CPU quota above its own CPU count.
        if self._engine_cpus is None:
            self._engine_cpus = float(self.client.info().get("NCPU") or 1)
        return self._engine_cpus

    def _find_managed(self, handle: str) -> Container | None:
        # A handle comes from the database: never act on a container Canopy did not make.
        container = self._find(handle)
        if container is None or container.labels.get(LABEL_MANAGED) != "true":
            return None
        return container

    async def exists(self, handle: str) -> bool:
        container = await asyncio.to_thread(self._find_managed, handle)
        return container is not None and container.status == "running"

    async def release(self, handle: str) -> None:
        container = await asyncio.to_thread(self._find_managed, handle)
        if container is not None:
            await asyncio.to_thread(self._remove, container)

    def _remove(self, container: Container) -> None:
        # force: SIGKILL and remove in one call; the bind-mounted workdir is not touched.
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            if "already in progress" not in str(error.explanation):
                raise
            self._wait_gone(str(container.id))

    def _wait_gone(self, container_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self._find(container_id) is not None:
            if time.monotonic() > deadline:
                raise SandboxError(f"sandbox container {container_id} is still being removed")
            time.sleep(0.1)

    async def sandboxes(self) -> dict[str, uuid.UUID]:
        return await asyncio.to_thread(self._managed_containers)

    def _managed_containers(self) -> dict[str, uuid.UUID]:
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
        trees = {str(container.id): tree_id_or_none(container.labels.get(LABEL_TREE)) for container in found}
        return {handle: tree_id for handle, tree_id in trees.items() if tree_id is not None}

    def containers_for(self, tree_id: uuid.UUID) -> list[str]:
        """Ids of every container (running or not) labelled with this tree: at most one."""
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL_TREE}={tree_id}"})
        return [str(container.id) for container in found]

    # -- commands --------------------------------------------------------------------

    async def run(
        self, handle: str, command: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> CommandResult:
        command_id = uuid.uuid4().hex
        execution = _Exec(await asyncio.to_thread(self._exec_create, handle, command_id, command))
        stream = asyncio.get_running_loop().run_in_executor(self._streams, self._pump, execution)
        try:
            await asyncio.wait_for(asyncio.shield(stream), timeout_seconds)
        except TimeoutError:
            await self._kill(handle, execution.exec_id, command_id)
            await self._drain(stream, execution)
            return await self._result(execution, timed_out=True)
        except asyncio.CancelledError:
            # Kill that command's group before the cancellation goes on; shielded so that a
            # second cancel cannot leave it running.
            await asyncio.shield(self._kill(handle, execution.exec_id, command_id))
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
        sock = self.client.api.exec_start(execution.exec_id, socket=True)
        execution.sock = sock
        # The client's read timeout must not end a command that is merely quiet.
        for candidate in (sock, getattr(sock, "_sock", None)):
            if candidate is not None and hasattr(candidate, "settimeout"):
                candidate.settimeout(None)
        sinks = {STDOUT: execution.stdout, STDERR: execution.stderr}
        try:
            for stream_id, data in frames_iter(sock, tty=False):
                sinks.get(stream_id, execution.stderr).feed(data)
        except (OSError, ValueError):
            pass  # the socket was cut by _drain after a kill
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    async def _drain(self, stream: asyncio.Future[None], execution: _Exec) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(stream), _DRAIN_SECONDS)
        except TimeoutError:
            # A process that escaped the group still holds the output open: stop listening.
            _shutdown(execution.sock)

    async def _result(self, execution: _Exec, timed_out: bool) -> CommandResult:
        exit_code = await asyncio.to_thread(self._exit_code, execution.exec_id)
        return CommandResult(exit_code, execution.stdout.text(), execution.stderr.text(), timed_out)

    def _exit_code(self, exec_id: str, wait_seconds: float = 2.0) -> int:
        # The stream can end a moment before the engine records the exit.
        deadline = time.monotonic() + wait_seconds
        while True:
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                return _KILLED_EXIT_CODE
            time.sleep(0.02)

    async def _kill(self, handle: str, exec_id: str, command_id: str) -> None:
        try:
            await asyncio.to_thread(self._kill_sync, handle, exec_id, command_id)
        except docker.errors.APIError as error:
            # The container is gone or stopped: its processes are gone with it.
            log.info("sandbox %s: kill of command %s skipped: %s", handle, command_id, error.explanation)

    def _kill_sync(self, handle: str, exec_id: str, command_id: str) -> None:
        if self.client.api.exec_inspect(exec_id).get("ExitCode") is not None:
            return  # it finished on its own just now: nothing to kill, no mark to leave behind
        killer = self.client.api.exec_create(handle, ["sh", "-c", _KILLER, "canopy-kill", command_id])
        self.client.api.exec_start(killer["Id"])


def _container_user(options: SandboxOptions) -> str | None:
    if options.user is not None:
        return options.user
    return None if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"


def _workspace_source(container: Container) -> str | None:
    for mount in container.attrs.get("Mounts", []):
        if mount.get("Destination") == WORKSPACE:
            return str(mount.get("Source"))
    return None


def _shutdown(sock: Any) -> None:
    for candidate in (getattr(sock, "_sock", None), sock):
        if isinstance(candidate, socket.socket):
            with contextlib.suppress(OSError):
                candidate.shutdown(socket.SHUT_RDWR)
            return
    with contextlib.suppress(OSError, AttributeError):
        sock.close()
