"""A project workdir's disk quota (sandbox/workdirs.py): a command or a write that fills it fills its
own disk image, never the data dir's file system; the image is the workdir from then on, and
whatever cannot be made so is refused with the workdir left as it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import workdirs
from sandbox.base import SandboxError, WorkdirFull
from sandbox.files import write_file
from tests.sandbox.conftest import SandboxKit, mounts_under

MB = 1024 * 1024


def _files(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): ("-> " + os.readlink(path) if path.is_symlink()
                                          else path.read_text() if path.is_file() else "dir")
            for path in sorted(root.rglob("*"))}


def _disks(root: Path) -> list[str]:
    return sorted(path.name for path in (root / workdirs.DISKS).iterdir() if path.suffix != ".lock")


async def test_a_command_that_fills_its_workdir_fills_its_own_disk_only(disks: Path, sandbox: SandboxKit) -> None:
    tree, workdir = await sandbox.new_tree(disks / "project-a")
    workdirs.prepare(workdir, 16)
    manager = sandbox.manager()

    filled = await manager.run_command(tree, workdir, "dd if=/dev/zero of=big bs=1M count=64 2>&1; echo rc=$?", 60)

    assert "No space left on device" in filled.stdout and "rc=0" not in filled.stdout, filled
    assert (workdir / "big").stat().st_size < 16 * MB
    image = workdirs.image_of(workdir)
    assert image.stat().st_blocks * 512 <= 16 * MB
    # Another project's workdir has room of its own, and this one has room again once a file goes.
    other_tree, other = await sandbox.new_tree(disks / "project-b")
    workdirs.prepare(other, 16)
    wrote = await manager.run_command(other_tree, other, "dd if=/dev/zero of=f bs=1M count=4 2>&1; echo rc=$?", 60)
    assert "rc=0" in wrote.stdout, wrote
    again = await manager.run_command(tree, workdir, "rm big; echo x > small; echo rc=$?", 60)
    assert "rc=0" in again.stdout, again
    # What the command wrote is in the image: gone with the mount, back with it.
    workdirs.unmount(workdir)
    assert list(workdir.iterdir()) == []
    workdirs.prepare(workdir, 16)
    assert (workdir / "small").read_text() == "x\n"


def test_a_write_past_the_quota_is_refused_and_writes_nothing(disks: Path) -> None:
    workdir = disks / "project"
    workdirs.prepare(workdir, 16)
    write_file(workdir, "first.txt", "a" * (9 * MB))

    with pytest.raises(WorkdirFull, match="no room left"):
        write_file(workdir, "sub/second.txt", "b" * (9 * MB))

    assert (workdir / "first.txt").stat().st_size == 9 * MB
    assert sorted(path.name for path in workdir.rglob("*")) == ["first.txt", "sub"]  # no temp file left


def test_the_image_is_the_workdir_after_a_reboot_even_with_the_quota_off(disks: Path) -> None:
    workdir = disks / "project"
    workdirs.prepare(workdir, 16)
    (workdir / "kept.txt").write_text("kept")
    workdirs.unmount(workdir)

    workdirs.prepare(workdir, 0)

    assert mounts_under(disks) == [workdir]
    assert _files(workdir) == {"kept.txt": "kept"}  # and no lost+found in the model's view


def test_a_workdir_from_before_the_quota_moves_into_its_image(disks: Path) -> None:
    """Copied into the image (modes, owners, symlinks kept); the old directory is moved aside, not
    deleted: a sandbox that bound it goes on writing there, and loses nothing."""
    workdir = disks / "project"
    (workdir / "src").mkdir(parents=True)
    (workdir / "src" / "main.py").write_text("print(1)")
    (workdir / "run.sh").write_text("#!/bin/sh\n")
    (workdir / "run.sh").chmod(0o755)
    (workdir / "link").symlink_to("src/main.py")
    os.chown(workdir / "src" / "main.py", 10001, 10001)
    before = _files(workdir)
    held = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)  # as a container's bind mount holds it
    try:
        workdirs.prepare(workdir, 16)
        os.close(os.open("late.txt", os.O_WRONLY | os.O_CREAT, dir_fd=held))  # written through it afterwards
    finally:
        os.close(held)

    assert mounts_under(disks) == [workdir]
    assert _files(workdir) == before
    assert (workdir / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (os.stat(workdir / "src" / "main.py").st_uid, os.stat(workdir / "src" / "main.py").st_gid) == (10001, 10001)
    assert _disks(disks) == ["project.before-quota", "project.ext4"]
    assert _files(disks / workdirs.DISKS / "project.before-quota") == {**before, "late.txt": ""}
    workdirs.unmount(workdir)
    assert list(workdir.iterdir()) == []  # beneath the mount nothing is left to be hidden


def test_a_workdir_too_big_for_its_quota_stays_as_it_was_until_the_quota_grows(disks: Path) -> None:
    """Not refused (the model's work goes on) and not copied again at every call: marked with the size
    it did not fit, and tried again with a larger one."""
    workdir = disks / "project"
    workdir.mkdir()
    (workdir / "big").write_bytes(b"x" * (20 * MB))

    workdirs.prepare(workdir, 16)
    workdirs.prepare(workdir, 16)

    assert mounts_under(disks) == []
    assert (workdir / "big").stat().st_size == 20 * MB
    assert _disks(disks) == ["project.unbounded"]
    assert (disks / workdirs.DISKS / "project.unbounded").read_text() == "16"
    workdirs.prepare(workdir, 32)
    assert mounts_under(disks) == [workdir] and (workdir / "big").stat().st_size == 20 * MB


def test_files_beneath_an_unmounted_image_are_moved_aside_not_hidden(disks: Path) -> None:
    workdir = disks / "project"
    workdirs.prepare(workdir, 16)
    (workdir / "kept.txt").write_text("in the image")
    workdirs.unmount(workdir)
    (workdir / "stray.txt").write_text("written while it was unmounted")

    workdirs.prepare(workdir, 16)

    assert mounts_under(disks) == [workdir]
    assert _files(workdir) == {"kept.txt": "in the image"}
    [found] = [name for name in _disks(disks) if name.startswith("project.found-")]
    assert _files(disks / workdirs.DISKS / found) == {"stray.txt": "written while it was unmounted"}


def test_a_copy_completed_before_a_crash_is_finished(disks: Path) -> None:
    """The process died after the copy into the image was complete (``.copied``), before the old
    directory was moved aside: the copy is the workdir, the old directory is kept aside."""
    workdir, donor = disks / "project", disks / "donor"
    workdirs.prepare(donor, 16)
    (donor / "copied.txt").write_text("in the copy")
    workdirs.unmount(donor)
    workdirs.image_of(donor).rename(workdirs.image_of(workdir).with_suffix(".copied"))
    workdir.mkdir()
    (workdir / "old.txt").write_text("in the old directory")

    workdirs.prepare(workdir, 16)

    assert _files(workdir) == {"copied.txt": "in the copy"}
    assert _disks(disks) == ["project.before-quota", "project.ext4"]
    assert _files(disks / workdirs.DISKS / "project.before-quota") == {"old.txt": "in the old directory"}


def test_what_the_file_system_refuses_is_a_sandbox_error(disks: Path) -> None:
    (disks / "file").write_text("not a directory")

    with pytest.raises(SandboxError, match="could not prepare the project workdir"):
        workdirs.prepare(disks / "file" / "project", 16)


def test_without_the_right_to_mount_the_quota_refuses_and_leaves_nothing(disks: Path) -> None:
    """A Canopy that may not mount says what to set, and makes no image. (Played by root without
    CAP_SYS_ADMIN; mount(8) refuses a loop mount to any other user outright.)"""
    if shutil.which("capsh") is None:
        pytest.skip("capsh (libcap2-bin) drops the capability")
    workdir = disks / "project"
    program = f"from pathlib import Path; from sandbox import workdirs; workdirs.prepare(Path({str(workdir)!r}), 16)"
    done = subprocess.run(["capsh", "--drop=cap_sys_admin", "--", "-c", f'exec {sys.executable} -c "$0"', program],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2], check=False)

    assert done.returncode != 0
    assert "SandboxError" in done.stderr and "CANOPY_SANDBOX_WORKDIR_MB=0" in done.stderr, done.stderr
    assert "run as root" in done.stderr
    assert mounts_under(disks) == []
    assert _disks(disks) == []


async def test_a_sandbox_made_before_the_quota_sees_the_workdir_moved_into_its_image(
        disks: Path, sandbox: SandboxKit) -> None:
    """Turning the quota on moves a used workdir into its image: a container that bound the
    directory beneath would find it empty, so it is made again."""
    tree, workdir = await sandbox.new_tree(disks / "project")
    manager = sandbox.manager()
    assert (await manager.run_command(tree, workdir, "echo old > f", 60)).exit_code == 0

    workdirs.prepare(workdir, 16)
    seen = await manager.run_command(tree, workdir, "cat f && echo new > g", 60)

    assert (seen.exit_code, seen.stdout) == (0, "old\n"), seen
    assert _files(workdir) == {"f": "old\n", "g": "new\n"}
    workdirs.unmount(workdir)
    assert list(workdir.iterdir()) == []
