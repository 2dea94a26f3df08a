"""The local process sandbox, for machines without a Docker engine.

THIS IS NOT ISOLATION. Commands run as the runtime's own user, on the host, with the
host's filesystem, network and installed software. It gives a tree the same *shape* as
the Docker sandbox, so cooperation works the same way:

- the working directory is the project workdir (Docker: ``/workspace``);
- a per-tree scratch dir plays the tree's ``/tmp``: it is exported as ``TMPDIR`` and
  ``CANOPY_TMP``, and is deleted on release. A literal ``/tmp`` inside a command is the
  host's ``/tmp`` — only the Docker backend makes ``/tmp`` itself per-tree;
- ``HOME`` is a per-tree dir too (Docker: ``/root`` in the container), dropped on release;
- every command runs in its own process group (``start_new_session``); cancelling it
  kills that group;
- ``kill`` of a command id kills every process carrying both the tree's ``CANOPY_TMP`` and
  that ``CANOPY_COMMAND_ID`` in its environment (found via ``/proc``: from any process,
  after the one that started the command died, and including children that left its
  group, unless they scrubbed their environment);
- release kills every process still carrying the tree's ``CANOPY_TMP`` the same way and
  deletes the scratch dir. On systems without ``/proc`` both only reach the groups of
  commands this process started;
- ``kill`` first leaves a tombstone (``<state_root>/<tree_id>/killed/<command id>.killed``,
  outside the workdir; only release deletes it), then looks for the processes: a command of
  that id started afterwards (by a Run that lost its lease on its way to starting it) exits at
  once as killed (137), never running. Every command starts as a wrapper shell that already
  carries the command id, looks for the tombstone, and only then becomes the command (exec):
  a kill either finds the wrapper in ``/proc`` or the wrapper finds the tombstone. Command ids
  are unique per Turn and call, and a killed one is never run again.

The environment of a command is minimal on purpose (``PATH``, locale, ``HOME``, ``TMPDIR``,
``CANOPY_*``): the runtime's own variables hold database URLs and model keys.

Use it only when chosen explicitly (``CANOPY_SANDBOX_BACKEND=local``); ``canopy up`` says so.

Sandbox state lives under ``<state_root>/<tree_id>/`` (default: the system temp dir),
which is also the handle, so a restarted runtime re-adopts it by path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

from sandbox.base import (
    FLOODED,
    KILLED_EXIT_CODE,
    OOM_SCORE_ADJ,
    CappedOutput,
    CommandResult,
    SandboxError,
    SandboxGone,
    SandboxOptions,
    check_command_id,
    private_dir,
    signal_exit_code,
    tree_id_or_none,
)

log = logging.getLogger(__name__)

_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_PROC = Path("/proc")
_WORKDIR_FILE = "workdir"
_KILLED_DIR = "killed"
# $1 = the command's tombstone, $2 = the command. This shell already carries the command id in its
# environment (a kill from now on finds it), then looks for a tombstone left before, takes the OOM
# score adjustment its children inherit (a host without /proc goes on without it), and only then
# becomes the command: exec keeps its pid, hence its process group.
_WRAPPER = (f'if [ -e "$1" ]; then exit {KILLED_EXIT_CODE}; fi; '
            f'{{ echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj; }} 2>/dev/null; exec /bin/sh -c "$2"')
_READ_CHUNK = 65536
# After a kill, how long to keep reading pipes that an escaped process may still hold open.
_DRAIN_SECONDS = 2.0
# How often the exit of a command killed at its timeout is looked for (it comes within milliseconds).
_EXIT_POLL_SECONDS = 0.01


def _default_state_root() -> Path:
    return Path(tempfile.gettempdir()) / f"canopy-sandboxes-{os.geteuid()}"


class LocalBackend:
    """Per-tree process sandboxes on the host. See the module docstring: not isolating."""

    name = "local"

    def __init__(self, state_root: Path | None = None) -> None:
        self.state_root = state_root or _default_state_root()
        # Process groups of commands in flight, per handle and command id: killed on release
        # and kill even where /proc is unavailable. Safe to signal: their leaders are not reaped yet.
        self._running: dict[str, dict[str, int]] = {}

    # -- lifecycle -------------------------------------------------------------------

    async def ensure(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        return await asyncio.to_thread(self._ensure_sync, tree_id, workdir)

    def _ensure_sync(self, tree_id: uuid.UUID, workdir: Path) -> str:
        private_dir(self.state_root)
        tree_dir = self.state_root / str(tree_id)
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        for sub in (tree_dir, tree_dir / "tmp", tree_dir / "home"):
            private_dir(sub)
        (tree_dir / _WORKDIR_FILE).write_text(str(workdir))
        return str(tree_dir)

    def close(self) -> None:
        """Nothing to free: the local backend holds no connections."""

    async def exists(self, handle: str) -> bool:
        tree_dir = Path(handle)
        return (tree_dir / "tmp").is_dir() and (tree_dir / _WORKDIR_FILE).is_file()

    async def fits(self, handle: str, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> bool:
        return await asyncio.to_thread(self._fits_sync, Path(handle), tree_id, workdir)

    def _fits_sync(self, tree_dir: Path, tree_id: uuid.UUID, workdir: Path) -> bool:
        try:
            recorded = (tree_dir / _WORKDIR_FILE).read_text()
        except OSError:
            return False
        return tree_dir.name == str(tree_id) and (tree_dir / "tmp").is_dir() and recorded == str(workdir.resolve())

    async def sandboxes(self) -> dict[str, uuid.UUID]:
        if not self.state_root.is_dir():
            return {}
        trees = {str(tree_dir): tree_id_or_none(tree_dir.name) for tree_dir in self.state_root.iterdir()}
        return {handle: tree_id for handle, tree_id in trees.items()
                if tree_id is not None and await self.exists(handle)}

    async def remove_leftovers(self) -> int:
        """Nothing: a local sandbox keeps everything in its tree's state dir (the sandbox itself)."""
        return 0

    async def release(self, handle: str) -> None:
        tree_dir = Path(handle)
        await asyncio.to_thread(self._release_sync, tree_dir)

    def _release_sync(self, tree_dir: Path) -> None:
        for pgid in self._running.pop(str(tree_dir), {}).values():
            _kill_group(pgid)
        _kill_marked_processes([_tmp_marker(tree_dir)])
        shutil.rmtree(tree_dir, ignore_errors=True)

    # -- commands --------------------------------------------------------------------

    async def run(self, handle: str, command: str, timeout_seconds: float, command_id: str) -> CommandResult:
        check_command_id(command_id)
        tree_dir = Path(handle)
        if not await self.exists(handle):
            raise SandboxGone(f"the local sandbox {handle} was released")
        if _tombstone(tree_dir, command_id).exists():
            return CommandResult(KILLED_EXIT_CODE, "", "", False)  # killed before: start nothing
        proc = await self._spawn(tree_dir, command, command_id)
        running = self._running.setdefault(handle, {})
        running[command_id] = proc.pid
        try:
            return await self._supervise(proc, timeout_seconds)
        finally:
            running.pop(command_id, None)
            if not running:
                self._running.pop(handle, None)

    async def kill(self, handle: str, command_id: str) -> bool:
        check_command_id(command_id)
        return await asyncio.to_thread(self._kill_sync, Path(handle), command_id)

    def _kill_sync(self, tree_dir: Path, command_id: str) -> bool:
        _leave_tombstone(tree_dir, command_id)  # first: a start that the search below misses sees it
        pgid = self._running.get(str(tree_dir), {}).get(command_id)
        if not _PROC.is_dir():
            return pgid is not None and _kill_group(pgid)
        if pgid is not None:
            _kill_group(pgid)
        return _kill_marked_processes([_tmp_marker(tree_dir), _command_marker(command_id)])

    async def _spawn(self, tree_dir: Path, command: str, command_id: str) -> asyncio.subprocess.Process:
        workdir = Path((tree_dir / _WORKDIR_FILE).read_text())
        try:
            return await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                _WRAPPER,
                "canopy",
                str(_tombstone(tree_dir, command_id)),
                command,
                cwd=workdir,
                env=self._environment(tree_dir, command_id),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own session, hence its own process group (pgid == pid)
            )
        except OSError as error:
            raise SandboxError(f"cannot start a command in {workdir}: {error.strerror}") from error

    @staticmethod
    def _environment(tree_dir: Path, command_id: str) -> dict[str, str]:
        env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        tmp = str(tree_dir / "tmp")  # keep in step with _tmp_marker
        env.update(
            TMPDIR=tmp,
            CANOPY_TMP=tmp,
            HOME=str(tree_dir / "home"),
            CANOPY_TREE_ID=tree_dir.name,
            CANOPY_SANDBOX="local",
            CANOPY_COMMAND_ID=command_id,  # keep in step with _command_marker
        )
        return env

    async def _supervise(self, proc: asyncio.subprocess.Process, timeout_seconds: float) -> CommandResult:
        stdout, stderr = CappedOutput(), CappedOutput()
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            asyncio.create_task(_pump(proc.stdout, stdout, proc.pid)),
            asyncio.create_task(_pump(proc.stderr, stderr, proc.pid)),
        ]
        timed_out = False
        try:
            await asyncio.wait_for(_finish(proc, readers), timeout_seconds)
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await _drain(readers)
            await _exited(proc)
        except asyncio.CancelledError:
            # Kill first, then let the cancellation go on: the caller must never wait on us.
            _kill_group(proc.pid)
            for reader in readers:
                reader.cancel()
            raise
        assert proc.returncode is not None
        return CommandResult(signal_exit_code(proc.returncode), stdout.text(),
                             stderr.text() + (FLOODED if stdout.flooded or stderr.flooded else ""), timed_out)


async def _pump(stream: asyncio.StreamReader, sink: CappedOutput, pgid: int) -> None:
    # Read on to the end after a flood's kill: asyncio's Process.wait() returns only once every pipe
    # is closed, and a pipe left unread stays paused, never reaching its end (the wait then hung
    # until the command's timeout).
    while chunk := await stream.read(_READ_CHUNK):
        if sink.feed(chunk):
            _kill_group(pgid)


async def _finish(proc: asyncio.subprocess.Process, readers: list[asyncio.Task[None]]) -> None:
    # Like subprocess.run: done when the process exited and both pipes reached EOF.
    # asyncio.wait, not gather: a timeout must not cancel the readers, _drain still needs them.
    await asyncio.wait(readers)
    await proc.wait()


async def _drain(readers: list[asyncio.Task[None]]) -> None:
    # A process that left the group (setsid) may hold the pipes open forever: bounded wait.
    _done, pending = await asyncio.wait(readers, timeout=_DRAIN_SECONDS)
    for reader in pending:
        reader.cancel()


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the killed process's exit is known (SandboxError if it is not, within _DRAIN_SECONDS).
    Not ``proc.wait()``: asyncio (3.11) answers it only once every pipe of the process is closed,
    and a process that left its group may hold them open for as long as it lives. The child
    watcher sees the exit itself, and sets ``returncode``; asyncio has no event for it."""
    for _ in range(int(_DRAIN_SECONDS / _EXIT_POLL_SECONDS)):
        if proc.returncode is not None:
            return
        await asyncio.sleep(_EXIT_POLL_SECONDS)
    raise SandboxError(f"the command's shell (pid {proc.pid}) did not exit after its kill")


def _kill_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _tombstone(tree_dir: Path, command_id: str) -> Path:
    # A suffix, as a command id may be "." or "..".
    return tree_dir / _KILLED_DIR / f"{command_id}.killed"


def _leave_tombstone(tree_dir: Path, command_id: str) -> None:
    # Released (maybe just now): no command can start in it, and a new sandbox starts without tombstones.
    with contextlib.suppress(FileNotFoundError):
        private_dir(tree_dir / _KILLED_DIR)
        _tombstone(tree_dir, command_id).touch()


def _tmp_marker(tree_dir: Path) -> bytes:
    # CANOPY_TMP, not CANOPY_TREE_ID: only this backend's processes carry this exact value
    # (a Docker sandbox's processes, visible in the host's /proc, have CANOPY_TMP=/tmp).
    return f"CANOPY_TMP={tree_dir / 'tmp'}".encode()


def _command_marker(command_id: str) -> bytes:
    return f"CANOPY_COMMAND_ID={command_id}".encode()


def _kill_marked_processes(markers: list[bytes], rounds: int = 20) -> bool:
    """SIGKILL every process whose environment carries all ``markers`` (Linux /proc); True if
    there was one.

    Repeated until none is left, because a dying shell may still fork one more child.
    """
    if not _PROC.is_dir():
        return False
    found = False
    for _ in range(rounds):
        pids = [pid for pid in _pids() if _has_markers(_PROC / str(pid), markers)]
        if not pids:
            return found
        found = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    log.warning("local sandbox: processes with %s survived", b" ".join(markers).decode())
    return found


def _pids() -> list[int]:
    own = os.getpid()
    return [int(entry.name) for entry in _PROC.iterdir() if entry.name.isdigit() and int(entry.name) != own]


def _has_markers(proc_dir: Path, markers: list[bytes]) -> bool:
    try:
        environ = set((proc_dir / "environ").read_bytes().split(b"\0"))
    except OSError:  # exited meanwhile, or not ours to read
        return False
    return all(marker in environ for marker in markers)
