"""A project workdir's disk quota: the workdir is a file system of its own, of a bounded size.

Without one, a sandboxed command (``fallocate -l 500G x``) fills the file system of the data dir,
which by default holds the embedded PostgreSQL too: every commit of every user then fails. With
``CANOPY_SANDBOX_WORKDIR_MB`` > 0 (the default), a workdir is an ext4 image of that size,
``<projects>/.disks/<project>.ext4``, loop-mounted on the workdir by the node's sandbox host before
every command, file read or write (:func:`prepare`). A command that fills it gets ``ENOSPC`` in its
own workdir, and ``write_file`` a ``WorkdirFull``; nothing else notices. The image is sparse: it
takes on disk what the workdir holds, plus ext4's few MiB.

Why a loop device: Docker's own quota (``--storage-opt size``) bounds a container's writable layer,
on overlay2 over XFS with project quotas only, never a bind mount; an XFS project quota needs the
data dir on XFS. A loop-mounted image works on any file system and for both backends. ``mount -o
loop`` needs root; without it every sandbox call fails with a sentence that says what to set, rather
than running unbounded, and no image is left behind (a new one is mounted before it is named).

What is durable is the image file; a mount is made again after a reboot. Once a workdir has an
image, the image *is* the workdir, whatever the setting says later: an unmounted workdir would be an
empty directory, and no model may find its files silently gone. Files found in the directory beneath
(written while it was unmounted, by a process that bound it before: nothing of Canopy's writes there)
are never hidden under the mount nor deleted: the directory is moved aside to
``<project>.found-<time>`` and logged. A workdir made before the quota is copied into its new image
(``<project>.part``, renamed ``<project>.copied`` once complete), then the old directory is moved
aside to ``<project>.before-quota`` (kept for the operator to delete), and only then the image takes
its name: a crash at any step leaves the old directory or a complete copy. Moving a directory never
loses a write: a sandbox that bound it before goes on writing into the moved one, and is made again
at its next command (sandbox/docker_backend.py). One that does not fit, or could not be copied, stays
a plain directory without a quota, marked (``<project>.unbounded``, holding the size tried) so that
it is tried again only with a larger quota; the log says so.

Canopy never unmounts a workdir: a sandbox container's bind mount holds it, and mounting the image a
second time while that one lives would corrupt it. Every step runs under a lock file of the
workdir's own (``<project>.lock``), so two processes of a node never mount one image twice.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
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
_COPY_TIMEOUT_SECONDS = 1800.0


def image_of(workdir: Path) -> Path:
    return workdir.parent / DISKS / f"{workdir.name}.ext4"


def prepare(workdir: Path, size_mb: int) -> None:
    """Make ``workdir`` ready to use: its image mounted on it when it has one (or ``size_mb`` > 0
    asks for one, made here), else a plain directory. SandboxError when it cannot be."""
    try:
        _prepare(workdir, size_mb)
    except OSError as error:
        raise SandboxError(f"could not prepare the project workdir: {error}") from error


def _prepare(workdir: Path, size_mb: int) -> None:
    image = image_of(workdir)
    if size_mb == 0 and not image.parent.is_dir():
        workdir.mkdir(parents=True, exist_ok=True)
        return
    image.parent.mkdir(parents=True, exist_ok=True)
    with _locked(image.with_suffix(".lock")):
        part = image.with_suffix(".part")
        if os.path.ismount(workdir):
            if part.exists() and not image.exists():  # made and mounted, then a crash before it was named
                part.rename(image)
            return
        workdir.mkdir(parents=True, exist_ok=True)
        copied = image.with_suffix(".copied")
        if copied.exists():  # a crash after the copy was complete
            _move_aside(workdir, image.with_suffix(".before-quota"))
            copied.rename(image)
        if image.exists():
            if any(workdir.iterdir()):
                aside = image.with_suffix(f".found-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S%f}")
                log.warning("workdir %s held files beneath its disk image, written while it was unmounted: "
                            "moved to %s", workdir, aside)
                _move_aside(workdir, aside)
            _mount(image, workdir)
        elif size_mb and not _unbounded(image, size_mb):
            _make(image, workdir, size_mb)


def unmount(workdir: Path) -> None:
    """Undo the mount :func:`prepare` made (the image stays): only for a workdir nothing binds any more."""
    _run(["umount", str(workdir)], "unmount the workdir's disk image")


def _unbounded(image: Path, size_mb: int) -> bool:
    """Whether the workdir stays without a quota: it did not fit one of ``size_mb`` or more before."""
    marker = image.with_suffix(".unbounded")
    with contextlib.suppress(FileNotFoundError, ValueError):
        return int(marker.read_text()) >= size_mb
    return False


def _make(image: Path, workdir: Path, size_mb: int) -> None:
    """The image of ``workdir``, holding what the workdir holds now (moved aside once it is copied)."""
    part = image.with_suffix(".part")
    part.unlink(missing_ok=True)  # a crash while it was made or filled: made again
    mounted = False
    try:
        with part.open("wb") as handle:
            handle.truncate(size_mb * 1024 * 1024)
        _run([*_MKFS, str(part)], "make the workdir's disk image")
        # lost+found would show in /workspace; ext4 makes it again should a check ever need it.
        _run(["debugfs", "-w", "-R", "rmdir lost+found", str(part)], "make the workdir's disk image")
        if not any(workdir.iterdir()):
            _mount(part, workdir)  # mounted before it is named: one that may not mount leaves no image
            mounted = True
            part.rename(image)
            return
        if not _copy_into(part, workdir, size_mb):
            return
        copied = image.with_suffix(".copied")
        part.rename(copied)
        _move_aside(workdir, image.with_suffix(".before-quota"))
        copied.rename(image)
    finally:
        if not mounted:
            part.unlink(missing_ok=True)
    _mount(image, workdir)
    log.warning("workdir %s moved into its disk image; what it held before is kept in %s", workdir,
                image.with_suffix(".before-quota"))


def _copy_into(part: Path, workdir: Path, size_mb: int) -> bool:
    """Copy the workdir into its new image; False (and marked unbounded) when it does not fit."""
    with tempfile.TemporaryDirectory(dir=part.parent, prefix=f"{workdir.name}.") as staging:
        _mount(part, Path(staging))
        try:
            copy = subprocess.run(["cp", "-a", f"{workdir}/.", staging], capture_output=True, check=False,
                                  timeout=_COPY_TIMEOUT_SECONDS)
            failed = copy.stderr.decode(errors="replace").strip()[-300:] if copy.returncode else ""
        except subprocess.TimeoutExpired:
            failed = f"the copy took longer than {_COPY_TIMEOUT_SECONDS:.0f} s"
        finally:
            unmount(Path(staging))
    if failed:
        image = part.with_suffix(".ext4")
        image.with_suffix(".unbounded").write_text(str(size_mb))
        log.warning("workdir %s stays without a disk quota: it does not fit %d MiB (CANOPY_SANDBOX_WORKDIR_MB), or "
                    "could not be copied (%s); a larger setting tries again", workdir, size_mb, failed)
    return not failed


def _move_aside(workdir: Path, aside: Path) -> None:
    """The directory (whatever still binds it keeps it) renamed to ``aside``, and an empty one in its place."""
    if any(workdir.iterdir()):
        workdir.rename(aside)
    workdir.mkdir(exist_ok=True)


def _mount(image: Path, target: Path) -> None:
    _run([*_MOUNT, str(image), str(target)],
         "mount the workdir's disk image (CANOPY_SANDBOX_WORKDIR_MB: a loop mount needs Canopy to run as root; "
         "or set CANOPY_SANDBOX_WORKDIR_MB=0 to go without a quota, and give the data dir's projects a file "
         "system of their own)")


def _run(command: list[str], doing: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxError(f"could not {doing}: {error}") from error
    if done.returncode:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        raise SandboxError(f"could not {doing}: {command[0]} said {said!r}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
