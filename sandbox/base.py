"""The sandbox backend interface, its value types, and the 64 KB output cap.

A *sandbox* is the shared execution environment of one cooperation tree (SPEC §12): every
member of the tree runs its commands in it and sees the same workdir files, ``/tmp``,
installed software and background processes. A backend creates or re-adopts it
(``ensure``), runs commands in it (``run``), and releases it (``release``: processes and
``/tmp`` go, the project workdir stays).

Cancellation is the asyncio kind: cancelling the task that awaits ``run`` kills that
command's process group (and only that one) before the ``CancelledError`` propagates.
Every command is started in a process group of its own for exactly that reason.

Both backends export ``CANOPY_TMP`` (the tree's scratch dir: ``/tmp`` in Docker, a per-tree
dir for the local backend, which also sets ``TMPDIR``) and ``CANOPY_TREE_ID``, so a portable
command writes ``"$CANOPY_TMP/x"`` rather than ``/tmp/x``.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Protocol, runtime_checkable

from persistence.errors import CanopyError, InvalidArgument, NotFound

OUTPUT_LIMIT_BYTES = 64 * 1024
DEFAULT_TIMEOUT_SECONDS = 120.0
# Exit code reported for a command killed by a signal, as a shell reports it (128 + signo).
SIGNAL_EXIT_BASE = 128
TRUNCATION_MARKER = "[canopy: output truncated"


class SandboxError(CanopyError):
    """The sandbox itself failed (engine gone, image missing, container vanished)."""

    status_code = 503


class SandboxGone(SandboxError):
    """The handle no longer names a live sandbox; claim the tree again."""


class PathRejected(InvalidArgument):
    """A read_file/write_file path that is absolute, climbs out with ``..`` or escapes by symlink."""


class FileMissing(NotFound):
    """read_file of a path that does not exist (or is not a regular file)."""


@dataclasses.dataclass(frozen=True)
class SandboxOptions:
    """How a tree's sandbox is built. Limits apply to the Docker backend only.

    ``network=False`` means no network at all (Docker ``network_mode="none"``); ``True``
    shares the host's network (``"host"``), the only other mode an engine started with
    ``--bridge=none`` offers.

    ``user`` is the Docker ``user`` of every command. ``None`` picks the runtime's own
    ``uid:gid`` when the runtime is not root — so files the sandbox writes into the
    project workdir stay editable by their owner — and the image's user (root) otherwise.
    """

    image: str = "canopy-sandbox:latest"
    memory: str = "2g"
    cpus: float = 2.0
    pids: int = 1024
    network: bool = False
    user: str | None = None


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

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > self._tail_limit:
                del self._tail[: len(self._tail) - self._tail_limit]

    @property
    def omitted(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
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
        self, handle: str, command: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> CommandResult:
        """Run ``command`` with ``sh -c`` in the workdir, in a process group of its own.

        Like ``subprocess.run``, a command is done when it exited *and* its stdout/stderr
        reached EOF: a background server must redirect its output (``nohup srv >log 2>&1 &``)
        or it holds the command open. Background processes outlive their command (other
        members see them) until the sandbox is released.

        A timeout kills the group and returns what was read with ``timed_out=True``.
        Cancelling the awaiting task kills the group, then re-raises ``CancelledError``.
        Raises ``SandboxGone`` when the handle names no live sandbox (nothing was started).
        """
        ...

    async def release(self, handle: str) -> None:
        """Kill every process and drop ``/tmp``; keep the workdir. Idempotent."""
        ...

    async def exists(self, handle: str) -> bool:
        """True when the handle names a live, usable sandbox."""
        ...

    async def sandboxes(self) -> dict[str, uuid.UUID]:
        """Every sandbox this backend made that still exists (live or not): handle -> tree id."""
        ...

    def close(self) -> None:
        """Free client resources (connections, threads). Sandboxes themselves stay."""
        ...
