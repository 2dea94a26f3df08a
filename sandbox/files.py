"""``read_file`` / ``write_file`` for the model tools, confined to the project workdir.

Rejected, with a clear sentence and nothing written: empty paths, absolute paths, any
``..`` component, NUL bytes, text with no UTF-8 form (a lone surrogate), a name longer than
255 bytes or a path longer than 4096 (in UTF-8; also once joined to the workdir's own path:
what the file system allows, found before a parent dir is made), paths that resolve
(through symlinks, including dangling ones) outside the workdir, and anything but a
regular file — a FIFO, a device node or a socket a sandboxed command planted is neither
opened nor replaced (opening a FIFO would wake its writer; opening a device can act on
the device). A symlink inside the workdir that points elsewhere inside the workdir is
followed: it is the project's own layout.
``write_file`` content is capped at ``CANOPY_SANDBOX_WRITE_MAX_BYTES``.

These run on the host against the workdir the sandbox mounts, so a sandboxed command
could plant a symlink or a FIFO and race the checks. Hence both walk down to the parent
directory one ``O_NOFOLLOW`` directory descriptor at a time (a write creates what is
missing) and name the file relative to it: a directory swapped for a symlink after the
checks is refused, never followed (an open through it could reach a device or a FIFO
outside). A read ``lstat``s the file, opens it with ``O_NOFOLLOW | O_NONBLOCK`` and checks
the descriptor (``fstat``: the same regular file; ``/proc/self/fd``: inside the workdir)
before reading a byte. A write writes a temp file created with ``O_EXCL | O_NOFOLLOW`` and renames it into
place relative to that descriptor: a rename replaces a name, it never writes through it,
and readers never see half a write.

When the runtime is root, what a write creates is handed to the Docker sandbox user
(``sandbox_file_owner``), so commands in the container can edit it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from pathlib import Path, PurePosixPath

from persistence.errors import InvalidArgument, shown
from persistence.settings import Settings, get_settings
from sandbox.base import (
    OUTPUT_LIMIT_BYTES,
    TRUNCATION_MARKER,
    FileMissing,
    PathRejected,
    WorkdirFull,
    as_text,
    sandbox_file_owner,
)

READ_LIMIT_BYTES = 4 * OUTPUT_LIMIT_BYTES
NAME_MAX_BYTES = 255  # one name (Linux NAME_MAX)
PATH_MAX_BYTES = 4096  # a whole path; the host's absolute one, with its NUL, too (Linux PATH_MAX)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symlink",
    stat.S_IFDIR: "a directory",
}


def resolve_inside(workdir: Path, path: str) -> Path:
    """The real path ``path`` names inside ``workdir``; PathRejected if it would leave it."""
    root = Path(os.path.realpath(workdir))
    relative = check_relative(path)
    target = Path(os.path.realpath(root / relative))
    if not target.is_relative_to(root):
        raise PathRejected(f"path {path!r} resolves outside the project workdir (through a symlink)")
    if target == root:
        raise PathRejected(f"path {path!r} names the project workdir itself, not a file")
    if len(os.fsencode(target)) >= PATH_MAX_BYTES:
        raise PathRejected(
            f"path {shown(path)} is too long: joined to the project workdir's own path on the host it is "
            f"{len(os.fsencode(target))} bytes, over the {PATH_MAX_BYTES - 1} the file system allows"
        )
    return target


def check_relative(path: str) -> PurePosixPath:
    """``path`` as a path inside a workdir, or PathRejected saying why it cannot be one (its length, a
    NUL, absolute, ``..``): what can be known before the workdir is looked at."""
    if not path or not path.strip():
        raise PathRejected("path is empty; give a file path relative to the project workdir")
    if "\0" in path:
        raise PathRejected("path contains a NUL byte")
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError:
        raise PathRejected(f"path {shown(path)} is not valid text (it holds a lone surrogate)") from None
    if len(encoded) > PATH_MAX_BYTES:
        raise PathRejected(
            f"path {shown(path)} is too long: {len(encoded)} bytes in UTF-8, over the {PATH_MAX_BYTES} "
            "a path may have"
        )
    for part in encoded.split(b"/"):
        if len(part) > NAME_MAX_BYTES:
            raise PathRejected(
                f"path {shown(path)} is too long: one of its names is {len(part)} bytes in UTF-8, over the "
                f"{NAME_MAX_BYTES} a file or directory name may have"
            )
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
    """The text of a file in the workdir (as :func:`sandbox.base.as_text`), capped at ``max_bytes``."""
    root = Path(os.path.realpath(workdir))
    target = resolve_inside(workdir, path)
    dir_fd = _open_parent(root, target.parent, None, path, create=False)
    try:
        try:
            seen = os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileMissing(f"no file {path!r} in the project workdir") from None
        if stat.S_ISDIR(seen.st_mode):
            raise FileMissing(f"{path!r} is a directory, not a file")
        _require_regular(seen, path)
        try:
            fd = os.open(target.name, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise FileMissing(f"no file {path!r} in the project workdir") from None
        except OSError as error:
            raise PathRejected(f"cannot open {path!r}: {error.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        opened = os.fstat(fd)
        _require_regular(opened, path)
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            raise PathRejected(f"{path!r} was replaced while being opened; try again")
        _check_fd_inside(fd, root, path)
        data = _read_up_to(fd, max_bytes + 1)
    finally:
        os.close(fd)
    text = as_text(data[:max_bytes])
    if len(data) > max_bytes:
        text += f"\n{TRUNCATION_MARKER}: file is larger than {max_bytes} bytes]\n"
    return text


def _require_regular(info: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "a special file")
        raise PathRejected(
            f"{path!r} is {kind}, not a regular file; read_file and write_file handle regular files only"
        )


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def write_file(workdir: Path, path: str, content: str, settings: Settings | None = None) -> int:
    """Write ``content`` (UTF-8) to a file in the workdir, creating parent dirs; return bytes written.

    ``settings`` (default: the runtime's) give the size cap and, for a root runtime, the sandbox user."""
    settings = settings or get_settings()
    data = content.encode("utf-8")
    if len(data) > settings.sandbox_write_max_bytes:
        raise InvalidArgument(
            f"content is {len(data)} bytes; write_file writes at most {settings.sandbox_write_max_bytes} bytes "
            "(CANOPY_SANDBOX_WRITE_MAX_BYTES): write it in parts, or generate it with run_command"
        )
    root = Path(os.path.realpath(workdir))
    target = resolve_inside(workdir, path)
    try:
        existing = os.lstat(target)
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        raise PathRejected(f"{path!r}: a parent of it is a file, not a directory") from None
    else:
        if stat.S_ISDIR(existing.st_mode):
            raise PathRejected(f"{path!r} is a directory")
        _require_regular(existing, path)
    owner = sandbox_file_owner(settings)
    try:
        dir_fd = _open_parent(root, target.parent, owner, path, create=True)
        try:
            _check_fd_inside(dir_fd, root, path)
            _replace_in_dir(dir_fd, target.name, data, owner, path)
        finally:
            os.close(dir_fd)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise WorkdirFull(f"the project workdir has no room left for {path!r} ({len(data)} bytes; the file was not "
                          "written): remove files it no longer needs, or write less") from None
    return len(data)


def _open_parent(root: Path, parent: Path, owner: tuple[int, int] | None, path: str, *, create: bool) -> int:
    """A descriptor of ``parent``, reached from ``root`` one real directory at a time (creating the
    missing ones when ``create``): a symlink swapped in on the way is refused, never followed. A
    path resolved once is not resolved again, so no name in it can lead elsewhere meanwhile."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parent.relative_to(root).parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if not create and isinstance(error, FileNotFoundError | NotADirectoryError):
                    raise FileMissing(f"no file {path!r} in the project workdir") from None
                raise PathRejected(f"{path!r}: {part!r} is not a directory of the project workdir "
                                   f"({error.strerror})") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _replace_in_dir(dir_fd: int, name: str, data: bytes, owner: tuple[int, int] | None, path: str) -> None:
    mode = 0o644
    with contextlib.suppress(FileNotFoundError):
        existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        _require_regular(existing, path)  # again, on the descriptor: a FIFO may have been planted since
        mode = stat.S_IMODE(existing.st_mode)  # keep an executable script executable
    temp = f".{name}.canopy-{uuid.uuid4().hex[:8]}.tmp"
    if len(os.fsencode(temp)) > NAME_MAX_BYTES:  # a name near the limit: the temp name must still fit
        temp = f".canopy-{uuid.uuid4().hex}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
            if owner is not None:
                os.fchown(handle.fileno(), *owner)
        # rename() replaces the name itself: a symlink planted there is replaced, never followed.
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def _check_fd_inside(fd: int, root: Path, path: str) -> None:
    """Re-check, on the opened descriptor, that a concurrent symlink swap did not redirect us."""
    link = Path(f"/proc/self/fd/{fd}")
    if not link.exists():  # no /proc (not Linux): the realpath check above is all we have
        return
    if not Path(os.readlink(link)).is_relative_to(root):
        raise PathRejected(f"path {path!r} resolves outside the project workdir (through a symlink)")
