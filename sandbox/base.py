"""The sandbox backend interface, its value types, and the 64 KB output cap.

A *sandbox* is the shared execution environment of one cooperation tree (SPEC §12): every
member of the tree runs its commands in it and sees the same workdir files, ``/tmp``,
installed software and background processes. A backend creates or re-adopts it
(``ensure``), runs commands in it (``run``), kills one command by its id (``kill``), and
releases it (``release``: processes and ``/tmp`` go, the project workdir stays).

Cancellation is the asyncio kind: cancelling the task that awaits ``run`` kills that
command's process group (and only that one) before the ``CancelledError`` propagates.
Every command is started in a process group of its own for exactly that reason. Every
command also carries ``CANOPY_COMMAND_ID=<its id>`` in its environment, so ``kill`` finds
it — and children that left its group — from any process, even after the one that
started it died.

Both backends export ``CANOPY_TMP`` (the tree's scratch dir: ``/tmp`` in Docker, a per-tree
dir for the local backend, which also sets ``TMPDIR``) and ``CANOPY_TREE_ID``, so a portable
command writes ``"$CANOPY_TMP/x"`` rather than ``/tmp/x``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from persistence.errors import CanopyError, InvalidArgument, NotFound
from persistence.settings import Settings
from persistence.text import storable

OUTPUT_LIMIT_BYTES = 64 * 1024
# Output one stream of a command may write before the command is stopped. Only OUTPUT_LIMIT_BYTES
# of it are kept, but every byte is still carried by the engine and read by the runtime, on the
# host's CPU and outside the sandbox's limits: `yes` under an hour's timeout ran a core of the host
# for that hour.
OUTPUT_STOP_BYTES = 1024 * OUTPUT_LIMIT_BYTES
FLOODED = (f"\n[canopy: the command wrote more than {OUTPUT_STOP_BYTES // (1024 * 1024)} MiB to one output stream; "
           "it was stopped if it still ran: send large output to a file and read the part you need]")
DEFAULT_TIMEOUT_SECONDS = 120.0
# Exit code reported for a command killed by a signal, as a shell reports it (128 + signo).
SIGNAL_EXIT_BASE = 128
KILLED_EXIT_CODE = SIGNAL_EXIT_BASE + 9  # SIGKILL: a killed command, or one refused by its tombstone
# Every command's processes carry the highest OOM score adjustment: limits bound each sandbox, not all
# of them together, and when the node runs out of memory the kernel kills what it scores highest,
# which must be a model's command before the database, Ray or Canopy (whose Ray workers take
# actors/runtime.py's RAY_WORKER_OOM_SCORE_ADJ, below this).
OOM_SCORE_ADJ = 1000
TRUNCATION_MARKER = "[canopy: output truncated"
# A command id names a pid file and is matched in /proc environments: no '/', no spaces, no quotes.
_COMMAND_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class SandboxError(CanopyError):
    """The sandbox itself failed (engine gone, image missing, container vanished)."""


class SandboxUnavailable(SandboxError):
    """No sandbox can be made here (no Docker engine answers); nothing ran."""


class SandboxGone(SandboxError):
    """The handle no longer names a live sandbox; claim the tree again."""


class SandboxFull(SandboxError):
    """The engine already runs its most sandboxes; nothing was made. ``needed``: how many must go first."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed


class ScopeFull(SandboxError):
    """The tree's user holds the most sandboxes they may, none of them idle on the claiming node;
    nothing was made. ``nodes``: the other nodes holding idle ones of theirs, whose hosts may release
    one (actors/sandbox_hosts.py)."""

    def __init__(self, message: str, nodes: list[str]) -> None:
        super().__init__(message)
        self.nodes = nodes


class WorkdirFull(SandboxError):
    """The project workdir has no room left: its disk image is full (sandbox/workdirs.py), or the file
    system beneath it."""


class SandboxMoved(SandboxError):
    """The tree's lease names another node's sandbox: nothing ran here; ask that node's host."""


class PathRejected(InvalidArgument):
    """A read_file/write_file path that is absolute, climbs out with ``..``, escapes by symlink,
    or names something other than a regular file (a FIFO, a device, a socket)."""


class FileMissing(NotFound):
    """read_file of a path that does not exist (or is a directory)."""


def _setting_default(name: str) -> Any:
    return Settings.model_fields[f"sandbox_{name}"].default


def parse_user(user: str) -> tuple[int, int]:
    """``"uid:gid"`` as two numbers."""
    uid, _, gid = user.partition(":")
    return int(uid), int(gid)


def sandbox_user(root_user: str) -> str:
    """The uid:gid that runs sandbox commands: the runtime's own, or ``root_user`` when the runtime
    is root (a non-root runtime must keep owning its files; the Docker backend refuses uid 0)."""
    if os.geteuid() != 0:
        return f"{os.geteuid()}:{os.getegid()}"
    return root_user


@dataclasses.dataclass(frozen=True)
class SandboxOptions:
    """How a tree's sandbox is built; the defaults are the settings' defaults. Limits, ``tmp_size``,
    ``network`` and ``max_containers`` apply to the Docker backend only; ``max_per_scope`` to both.

    ``network`` is a Docker network mode: ``"none"`` (no network) or ``"host"`` (the host's),
    the only other mode an engine started with ``--bridge=none`` offers.
    ``user`` is the ``uid:gid`` of every command (see ``sandbox_user``).
    """

    image: str = _setting_default("image")
    memory: str = _setting_default("memory")
    cpus: float = _setting_default("cpus")
    pids: int = _setting_default("pids")
    tmp_size: str = _setting_default("tmp_size")
    network: str = _setting_default("network")
    max_containers: int = _setting_default("max_containers")
    max_per_scope: int = _setting_default("max_per_scope")
    user: str = dataclasses.field(default_factory=lambda: sandbox_user(_setting_default("user")))

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxOptions:
        return cls(
            image=settings.sandbox_image,
            memory=settings.sandbox_memory,
            cpus=settings.sandbox_cpus,
            pids=settings.sandbox_pids,
            tmp_size=settings.sandbox_tmp_size,
            network=settings.sandbox_network,
            max_containers=settings.sandbox_max_containers,
            max_per_scope=settings.sandbox_max_per_scope,
            user=sandbox_user(settings.sandbox_user),
        )


def sandbox_file_owner(settings: Settings) -> tuple[int, int] | None:
    """Who must own what Canopy writes into a project workdir so that sandbox commands can edit it:
    the Docker sandbox user when the runtime is root (its files would be root's otherwise), else
    nobody (files are the runtime's own, and so are the commands')."""
    if os.geteuid() != 0 or settings.sandbox_backend != "docker":
        return None
    return parse_user(sandbox_user(settings.sandbox_user))


def private_dir(path: Path, mode: int = 0o700) -> Path:
    """``path`` as a directory only this user can write (``mode``: by default only this user can
    use it at all), made if missing.

    Such dirs live in the shared temp dir: a dir another user planted there is refused."""
    path.mkdir(mode=mode, exist_ok=True)
    if path.lstat().st_uid != os.geteuid() or not path.is_dir() or path.is_symlink():
        raise SandboxError(f"sandbox directory {path} belongs to another user; refusing to use it")
    path.chmod(mode)
    return path


def check_command_id(command_id: str) -> str:
    if not _COMMAND_ID.fullmatch(command_id):
        raise InvalidArgument(
            f"command id {command_id!r} must be 1-128 characters of letters, digits, '_', '.', ':' or '-'"
        )
    return command_id


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What ``run_command`` returns. ``exit_code`` is 128 + signal for a killed command."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def as_tool_result(self) -> dict[str, object]:
        result: dict[str, object] = {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
        }
        if self.timed_out:
            result["timed_out"] = True
        return result


def as_text(data: bytes | bytearray) -> str:
    """Bytes a command printed or a file holds, as text that can be stored: UTF-8, with U+FFFD for
    each byte that is not (as Python's ``errors="replace"``) and for each NUL (any binary file has
    some; see persistence/text.py)."""
    return storable(data.decode("utf-8", errors="replace"))


class CappedOutput:
    """Collects one output stream, keeping at most ``limit`` bytes: the head and the tail.

    The first half and the last half of the limit are kept because a long build log's
    useful parts are its start (what ran) and its end (the error). Everything is still
    read (so the command never blocks on a full pipe); the middle is counted and dropped.
    """

    def __init__(self, limit: int = OUTPUT_LIMIT_BYTES) -> None:
        self._head_limit = limit - limit // 2
        self._tail_limit = limit // 2
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> bool:
        """Keep what the limit keeps of ``data``; True when it took the stream past OUTPUT_STOP_BYTES
        (the reader stops the command then, once, and reads on to the stream's end)."""
        before = self.total
        self.total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > self._tail_limit:
                del self._tail[: len(self._tail) - self._tail_limit]
        return before <= OUTPUT_STOP_BYTES < self.total

    @property
    def flooded(self) -> bool:
        """Whether the stream went past OUTPUT_STOP_BYTES (its command was stopped)."""
        return self.total > OUTPUT_STOP_BYTES

    @property
    def omitted(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def text(self) -> str:
        head, tail = as_text(self._head), as_text(self._tail)
        if not self.omitted:
            return head + tail
        marker = f"\n{TRUNCATION_MARKER}: {self.omitted} of {self.total} bytes omitted]\n"
        return head + marker + tail


def signal_exit_code(returncode: int) -> int:
    """asyncio reports death by signal N as -N; report it the way a shell does (128 + N)."""
    return SIGNAL_EXIT_BASE - returncode if returncode < 0 else returncode


def tree_id_or_none(text: str | None) -> uuid.UUID | None:
    """The tree id a sandbox's label or directory name carries; None for anything else."""
    try:
        return uuid.UUID(text or "")
    except ValueError:
        return None


@runtime_checkable
class SandboxBackend(Protocol):
    """One way to provide per-tree sandboxes. Handles are opaque strings a lease row stores."""

    name: str  # "docker" | "local": recorded in the lease row

    async def ensure(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        """Create the tree's sandbox, or re-adopt the one that already exists; return its handle."""
        ...

    async def run(
        self, handle: str, command: str, timeout_seconds: float, command_id: str
    ) -> CommandResult:
        """Run ``command`` with ``sh -c`` in the workdir, in a process group of its own.

        Like ``subprocess.run``, a command is done when it exited *and* its stdout/stderr
        reached EOF: a background server must redirect its output (``nohup srv >log 2>&1 &``)
        or it holds the command open. Background processes outlive their command (other
        members see them) until the sandbox is released or ``kill`` names their command.

        ``command_id`` (see ``check_command_id``) is the caller's; it must not name another
        command running in the same sandbox.

        A timeout kills the group and returns what was read with ``timed_out=True``.
        Cancelling the awaiting task kills the group, then re-raises ``CancelledError``.
        Raises ``SandboxGone`` when the handle names no live sandbox (nothing was started).
        """
        ...

    async def kill(self, handle: str, command_id: str) -> bool:
        """SIGKILL every process of that command still running (its group, and processes that
        left it but carry its ``CANOPY_COMMAND_ID``). True if one was found; idempotent, and it
        works from any process.

        First it leaves a tombstone of the id, kept as long as the sandbox (Docker: on the host,
        read-only in the container, so a restart of the container keeps it and the sandbox user
        cannot remove it; local: in the tree's state dir, outside the workdir): a
        ``run`` of that id started afterwards, or racing this kill, exits at once as killed (137,
        no output) and never runs the command. Recovery kills the command of a Run that lost its
        lease while that Run may still be on its way to starting it; command ids are unique per
        Turn and call, so a killed id is never legitimately run again. An unknown or finished id
        gives False, with only its tombstone left behind."""
        ...

    async def release(self, handle: str) -> None:
        """Kill every process and drop ``/tmp``; keep the workdir. Idempotent."""
        ...

    async def exists(self, handle: str) -> bool:
        """True when the handle names a live, usable sandbox."""
        ...

    async def fits(self, handle: str, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> bool:
        """True when the handle names a live sandbox that ``ensure(tree_id, workdir, options)`` would
        keep as it is (same tree, workdir and settings); a claim rebuilds one that does not fit."""
        ...

    async def sandboxes(self) -> dict[str, uuid.UUID]:
        """Every sandbox this backend made that still exists (live or not): handle -> tree id."""
        ...

    async def remove_leftovers(self) -> int:
        """Remove what this backend keeps beside a sandbox that no longer exists (removed outside
        Canopy, or by a process that died before removing the rest); how many trees' leftovers went."""
        ...

    def close(self) -> None:
        """Free client resources (connections, threads). Sandboxes themselves stay."""
        ...
