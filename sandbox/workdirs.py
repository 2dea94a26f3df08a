"""A project workdir's disk quota: the workdir is a file system of its own, of a bounded size.

Without one, a sandboxed command (``fallocate -l 500G x``) fills the file system of the data dir,
which by default holds the embedded PostgreSQL too: every commit of every user then fails. With
``CANOPY_SANDBOX_WORKDIR_MB`` > 0 (the default), a workdir is an ext4 image of that size,
``<projects>/.disks/<project>.ext4``, loop-mounted on the workdir by the node's sandbox host before
the first command, file read or write that needs it (:func:`prepare`). A command that fills it gets
``ENOSPC`` in its own workdir, and ``write_file`` a ``WorkdirFull``; nothing else notices. The
image is sparse: it takes on disk what the workdir holds, plus ext4's few MiB.

Why a loop device: Docker's own quota (``--storage-opt size``) bounds a container's writable layer,
on overlay2 over XFS with project quotas only, never a bind mount; an XFS project quota needs the
data dir on XFS. A loop-mounted image works on any file system and for both backends. It needs the
right to mount (root, or ``CAP_SYS_ADMIN``); without it every sandbox call fails with a sentence
that says what to set, rather than running unbounded.

What is durable is the image file; a mount is only made again (after a reboot, or the first time).
Once a workdir has an image, the image *is* the workdir, whatever the setting says later: an
unmounted workdir would be an empty directory, and no model may find its files silently gone.
For the same reason a workdir with files beside its image (written while it was unmounted) is
refused, never hidden under the mount. A workdir made before the quota keeps its files: they are
copied into its new image (``<project>.part``, renamed ``<project>.copied`` once complete), the
directory is emptied, and only then is the image renamed into place, so a crash at any step leaves
either the old directory or a complete copy. A new empty image is mounted before it is named, so a
process that may not mount leaves none behind. A copy that does not fit is refused, and the directory
is kept as it was. Canopy never unmounts a workdir: a sandbox container's bind mount holds it, and
mounting the image a second time while that one lives would corrupt it.

Every step runs under a lock file of the workdir's own (``<project>.lock``), so two processes of a
node (a host and its successor) never mount one image twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sandbox.base import SandboxError

log = logging.getLogger(__name__)

DISKS = ".disks"
_MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-J", "size=4", "-E", "lazy_itable_init=1,lazy_journal_init=1"]
# nosuid, nodev: nothing in a workdir gains a privilege or reaches a device, whoever made it.
_MOUNT = ["mount", "-o", "loop,nosuid,nodev"]


def image_of(workdir: Path) -> Path:
    return workdir.parent / DISKS / f"{workdir.name}.ext4"


def prepare(workdir: Path, size_mb: int) -> None:
    """Make ``workdir`` ready to use: its image mounted on it when it has one (or ``size_mb`` > 0
    asks for one, made here), else a plain directory. SandboxError when it cannot be."""
    image = image_of(workdir)
    if size_mb == 0 and not image.parent.is_dir():
        workdir.mkdir(parents=True, exist_ok=True)
        return
    image.parent.mkdir(parents=True, exist_ok=True)
    with _locked(image.with_suffix(".lock")):
        if os.path.ismount(workdir):
            part = image.with_suffix(".part")
            if part.exists() and not image.exists():  # made and mounted, then a crash before it was named
                part.rename(image)
            return
        workdir.mkdir(parents=True, exist_ok=True)
        copied = image.with_suffix(".copied")
        if copied.exists():  # a crash after the copy was complete
            _empty(workdir)
            copied.rename(image)
        if image.exists():
            if any(workdir.iterdir()):
                raise SandboxError(
                    f"the project workdir {workdir} holds files beside its disk image {image}, which would hide "
                    "them: move them into the image (mount it elsewhere) or away, then try again")
            _mount(image, workdir)
        elif size_mb:
            _make(image, workdir, size_mb)
        else:
            return
    log.info("mounted the disk image of workdir %s", workdir)


def unmount(workdir: Path) -> None:
    """Undo the mount :func:`prepare` made (the image stays): only for a workdir nothing binds any more."""
    _run(["umount", str(workdir)], "unmount the workdir's disk image")


def _make(image: Path, workdir: Path, size_mb: int) -> None:
    """The image of ``workdir``, holding what the workdir holds now (emptied once it is copied)."""
    part = image.with_suffix(".part")
    part.unlink(missing_ok=True)  # a crash while it was made or filled: made again
    try:
        with part.open("wb") as handle:
            handle.truncate(size_mb * 1024 * 1024)
        _run([*_MKFS, str(part)], "make the workdir's disk image")
        # lost+found would show in /workspace; ext4 makes it again should a check ever need it.
        _run(["debugfs", "-w", "-R", "rmdir lost+found", str(part)], "make the workdir's disk image")
        if any(workdir.iterdir()):
            _copy_into(part, workdir, size_mb)
            copied = image.with_suffix(".copied")
            part.rename(copied)
            _empty(workdir)
            copied.rename(image)
        else:
            # Mounted before it is named: a process that may not mount leaves no image behind.
            _mount(part, workdir)
            part.rename(image)
            return
    finally:
        part.unlink(missing_ok=True)
    _mount(image, workdir)


def _copy_into(part: Path, workdir: Path, size_mb: int) -> None:
    with tempfile.TemporaryDirectory(dir=part.parent, prefix=f"{workdir.name}.") as staging:
        _mount(part, Path(staging))
        try:
            copy = subprocess.run(["cp", "-a", f"{workdir}/.", staging], capture_output=True, text=True, check=False)
        finally:
            unmount(Path(staging))
    if copy.returncode:
        raise SandboxError(
            f"the project workdir {workdir} does not fit the disk quota of {size_mb} MiB (CANOPY_SANDBOX_WORKDIR_MB) "
            f"it was given now, or could not be copied ({copy.stderr.strip()[-300:]}): it is kept as it was; "
            "remove files from it, or raise the setting")


def _empty(workdir: Path) -> None:
    for entry in workdir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _mount(image: Path, target: Path) -> None:
    _run([*_MOUNT, str(image), str(target)],
         "mount the workdir's disk image (CANOPY_SANDBOX_WORKDIR_MB needs a loop mount: run Canopy as root or with "
         "CAP_SYS_ADMIN, or set CANOPY_SANDBOX_WORKDIR_MB=0 to go without a quota and give the data dir's "
         "projects a file system of their own)")


def _run(command: list[str], doing: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxError(f"could not {doing}: {error}") from error
    if done.returncode:
        raise SandboxError(f"could not {doing}: {command[0]} said {done.stderr.strip()[-300:]!r}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
