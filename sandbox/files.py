"""``read_file`` / ``write_file`` for the model tools, confined to the project workdir.

Rejected, with a clear sentence and nothing written: empty paths, absolute paths, any
``..`` component, NUL bytes, and paths that resolve (through symlinks, including
dangling ones) outside the workdir. A symlink inside the workdir that points elsewhere
inside the workdir is followed: it is the project's own layout.

These run on the host against the workdir the sandbox mounts, so a sandboxed command
could plant a symlink to a host path and race the check. Hence the write goes through a
directory file descriptor that is verified *after* opening (``/proc/self/fd``), into a
temp file created with ``O_EXCL | O_NOFOLLOW``, renamed into place relative to that same
descriptor. Readers of the file never see half a write.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path, PurePosixPath

from sandbox.base import OUTPUT_LIMIT_BYTES, TRUNCATION_MARKER, FileMissing, PathRejected

READ_LIMIT_BYTES = 4 * OUTPUT_LIMIT_BYTES


def resolve_inside(workdir: Path, path: str) -> Path:
    """The real path ``path`` names inside ``workdir``; PathRejected if it would leave it."""
    root = Path(os.path.realpath(workdir))
    relative = _check_relative(path)
    target = Path(os.path.realpath(root / relative))
    if not target.is_relative_to(root):
        raise PathRejected(f"path {path!r} resolves outside the project workdir (through a symlink)")
    if target == root:
        raise PathRejected(f"path {path!r} names the project workdir itself, not a file")
    return target


def _check_relative(path: str) -> PurePosixPath:
    if not path or not path.strip():
        raise PathRejected("path is empty; give a file path relative to the project workdir")
    if "\0" in path:
        raise PathRejected("path contains a NUL byte")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise PathRejected(
            f"path {path!r} is absolute; give a path relative to the project workdir "
            "(/workspace in the sandbox)"
        )
    if ".." in pure.parts:
        raise PathRejected(f"path {path!r} contains '..'; paths must stay inside the project workdir")
    return pure


def read_file(workdir: Path, path: str, max_bytes: int = READ_LIMIT_BYTES) -> str:
    """The text of a file in the workdir (UTF-8, undecodable bytes replaced), capped at ``max_bytes``."""
    root = Path(os.path.realpath(workdir))
    target = resolve_inside(workdir, path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileMissing(f"no file {path!r} in the project workdir") from None
    except OSError as error:
        raise PathRejected(f"cannot open {path!r}: {error.strerror}") from None
    try:
        _check_fd_inside(fd, root, path)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileMissing(f"{path!r} is not a regular file")
        data = _read_up_to(fd, max_bytes + 1)
    finally:
        os.close(fd)
    text = data[:max_bytes].decode("utf-8", errors="replace")
    if len(data) > max_bytes:
        text += f"\n{TRUNCATION_MARKER}: file is larger than {max_bytes} bytes]\n"
    return text


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def write_file(workdir: Path, path: str, content: str) -> int:
    """Write ``content`` (UTF-8) to a file in the workdir, creating parent dirs; return bytes written."""
    root = Path(os.path.realpath(workdir))
    target = resolve_inside(workdir, path)
    if target.is_dir():
        raise PathRejected(f"{path!r} is a directory")
    data = content.encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _check_fd_inside(dir_fd, root, path)
        _replace_in_dir(dir_fd, target.name, data)
    finally:
        os.close(dir_fd)
    return len(data)


def _replace_in_dir(dir_fd: int, name: str, data: bytes) -> None:
    mode = _existing_mode(dir_fd, name)
    temp = f".{name}.canopy-{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)  # keep an executable script executable
        # rename() replaces the name itself: a symlink planted there is replaced, never followed.
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def _existing_mode(dir_fd: int, name: str) -> int:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0o644
    return stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else 0o644


def _check_fd_inside(fd: int, root: Path, path: str) -> None:
    """Re-check, on the opened descriptor, that a concurrent symlink swap did not redirect us."""
    link = Path(f"/proc/self/fd/{fd}")
    if not link.exists():  # no /proc (not Linux): the realpath check above is all we have
        return
    if not Path(os.readlink(link)).is_relative_to(root):
        raise PathRejected(f"path {path!r} resolves outside the project workdir (through a symlink)")
