"""read_file / write_file stay inside the project workdir; a rejected call writes nothing."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from persistence.errors import InvalidArgument
from persistence.settings import Settings
from sandbox import files
from sandbox.base import TRUNCATION_MARKER, FileMissing, PathRejected
from sandbox.files import read_file, write_file


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A workdir and, beside it, an outside dir holding a secret file."""
    workdir, outside = tmp_path / "workdir", tmp_path / "outside"
    workdir.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return workdir, outside


def _tree(root: Path) -> dict[str, str]:
    """Every file under root with its content (symlinks by target), for before/after checks."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            found[rel] = path.read_text()
    return found


def test_write_then_read_inside_the_workdir(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout

    written = write_file(workdir, "src/pkg/module.py", "print('hé')\n")

    assert written == len("print('hé')\n".encode())
    assert (workdir / "src" / "pkg" / "module.py").read_text() == "print('hé')\n"
    assert read_file(workdir, "src/pkg/module.py") == "print('hé')\n"
    assert read_file(workdir, "./src//pkg/module.py") == "print('hé')\n"
    assert [p.name for p in (workdir / "src" / "pkg").iterdir()] == ["module.py"]  # no temp file left


def test_overwrite_keeps_the_file_mode(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout
    script = workdir / "run.sh"
    script.write_text("old")
    script.chmod(0o755)

    write_file(workdir, "run.sh", "#!/bin/sh\necho new\n")

    assert script.read_text() == "#!/bin/sh\necho new\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("/etc/passwd", "absolute"),
        ("/tmp/canopy-escape", "absolute"),
        ("", "empty"),
        ("a\0b", "NUL"),
        (".", "workdir itself"),
    ],
)
def test_escaping_paths_are_rejected_and_write_nothing(
    layout: tuple[Path, Path], path: str, reason: str
) -> None:
    workdir, _ = layout
    before = _tree(workdir.parent)

    with pytest.raises(PathRejected, match=reason):
        write_file(workdir, path, "pwned")
    with pytest.raises(PathRejected, match=reason):
        read_file(workdir, path)

    assert _tree(workdir.parent) == before
    assert not Path("/tmp/canopy-escape").exists()
    assert not (workdir.parent / "x").exists()


def test_a_symlinked_dir_pointing_outside_is_rejected(layout: tuple[Path, Path]) -> None:
    workdir, outside = layout
    (workdir / "link").symlink_to(outside)
    before = _tree(workdir.parent)

    with pytest.raises(PathRejected, match="outside the project workdir"):
        write_file(workdir, "link/new.txt", "pwned")
    with pytest.raises(PathRejected, match="outside the project workdir"):
        write_file(workdir, "link/deeper/new.txt", "pwned")
    with pytest.raises(PathRejected, match="outside the project workdir"):
        read_file(workdir, "link/secret.txt")

    assert _tree(workdir.parent) == before
    assert not (outside / "deeper").exists()


def test_a_symlinked_file_pointing_outside_is_rejected(layout: tuple[Path, Path]) -> None:
    workdir, outside = layout
    (workdir / "secret-link").symlink_to(outside / "secret.txt")
    (workdir / "dangling").symlink_to(outside / "not-yet.txt")
    (workdir / "passwd").symlink_to("/etc/passwd")
    before = _tree(workdir.parent)

    for name in ("secret-link", "dangling", "passwd"):
        with pytest.raises(PathRejected, match="outside the project workdir"):
            write_file(workdir, name, "pwned")
    with pytest.raises(PathRejected):
        read_file(workdir, "secret-link")
    with pytest.raises(PathRejected):
        read_file(workdir, "passwd")

    assert _tree(workdir.parent) == before
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (outside / "not-yet.txt").exists()


def test_a_symlink_inside_the_workdir_is_followed(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout
    (workdir / "real").mkdir()
    (workdir / "real" / "data.txt").write_text("one")
    (workdir / "alias").symlink_to("real")
    (workdir / "data-link").symlink_to("real/data.txt")

    write_file(workdir, "data-link", "two")

    assert read_file(workdir, "alias/data.txt") == "two"
    assert (workdir / "data-link").is_symlink()  # the link stays, its target was written
    assert (workdir / "real" / "data.txt").read_text() == "two"


def test_missing_files_directories_and_large_files(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout
    (workdir / "dir").mkdir()
    (workdir / "big.txt").write_text("x" * 1000)

    with pytest.raises(FileMissing):
        read_file(workdir, "nope.txt")
    with pytest.raises(FileMissing):
        read_file(workdir, "dir")
    with pytest.raises(PathRejected, match="directory"):
        write_file(workdir, "dir", "x")
    big = read_file(workdir, "big.txt", max_bytes=100)
    assert big.startswith("x" * 100 + "\n" + TRUNCATION_MARKER)
    assert (workdir / "dir").is_dir() and (workdir / "big.txt").read_text() == "x" * 1000


def test_content_over_the_write_limit_is_refused_and_writes_nothing(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout
    settings = Settings(sandbox_write_max_bytes=10)
    before = _tree(workdir.parent)

    with pytest.raises(InvalidArgument, match="CANOPY_SANDBOX_WRITE_MAX_BYTES"):
        write_file(workdir, "new/big.txt", "é" * 6, settings)  # 12 bytes in UTF-8

    assert _tree(workdir.parent) == before and not (workdir / "new").exists()
    assert write_file(workdir, "new/ok.txt", "x" * 10, settings) == 10


def test_a_root_runtime_hands_what_it_writes_to_the_sandbox_user(layout: tuple[Path, Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("a non-root runtime keeps its own files (the sandbox runs as it)")
    workdir, _ = layout
    docker_settings = Settings(sandbox_backend="docker", sandbox_user="10002:10003")

    write_file(workdir, "made/by/host.txt", "x", docker_settings)
    write_file(workdir, "local.txt", "x", Settings(sandbox_backend="local"))

    owners = {path: (workdir / path).stat() for path in ("made", "made/by", "made/by/host.txt", "local.txt")}
    assert {path: (info.st_uid, info.st_gid) for path, info in owners.items()} == {
        "made": (10002, 10003),
        "made/by": (10002, 10003),
        "made/by/host.txt": (10002, 10003),
        "local.txt": (0, 0),  # the local backend runs commands as the runtime itself
    }


def test_a_file_where_a_parent_dir_should_be_is_refused(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout
    (workdir / "plain").write_text("a file")
    before = _tree(workdir.parent)

    with pytest.raises(PathRejected):
        write_file(workdir, "plain/child.txt", "x")

    assert _tree(workdir.parent) == before


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("sub/" + "b" * 256, "256 bytes"),  # one name over the 255 bytes a file system allows
        ("a" * 300, "300 bytes"),
        ("sub/" + "é" * 128, "256 bytes"),  # 128 characters, 256 bytes in UTF-8
        ("/".join(["d" * 200] * 21), "4220 bytes"),  # every name fits, the whole path does not
    ],
)
def test_over_long_paths_are_rejected_and_create_nothing(layout: tuple[Path, Path], path: str, reason: str) -> None:
    """A name longer than a file system allows was found only when the file was made, after its
    parent dirs were: the call failed as an internal error and left the dirs behind."""
    workdir, _ = layout
    before = _tree(workdir.parent)

    with pytest.raises(PathRejected, match=f"too long.*{reason}"):
        write_file(workdir, path, "x")
    with pytest.raises(PathRejected, match=f"too long.*{reason}"):
        read_file(workdir, path)

    assert _tree(workdir.parent) == before and list(workdir.iterdir()) == []


def test_a_path_too_long_with_the_workdirs_own_is_rejected_and_creates_nothing(layout: tuple[Path, Path]) -> None:
    """Within the bounds of a relative path, but not once joined to the workdir's path on the host."""
    workdir, _ = layout
    path = "/".join(["d" * 254] * 16)  # 4079 bytes
    assert len(str(workdir)) + 1 + len(path) >= 4096

    with pytest.raises(PathRejected, match="too long"):
        write_file(workdir, path, "x")
    with pytest.raises(PathRejected, match="too long"):
        read_file(workdir, path)

    assert list(workdir.iterdir()) == []


def test_a_path_that_is_not_valid_text_is_rejected(layout: tuple[Path, Path]) -> None:
    """JSON can carry a lone surrogate, which has no UTF-8 form to name a file with."""
    workdir, _ = layout

    with pytest.raises(PathRejected, match="not valid text"):
        write_file(workdir, "sub/a\ud800b", "x")
    with pytest.raises(PathRejected, match="not valid text"):
        read_file(workdir, "a\ud800b")

    assert list(workdir.iterdir()) == []


def test_names_up_to_the_file_systems_limit_are_written_and_read(layout: tuple[Path, Path]) -> None:
    workdir, _ = layout
    longest = "sub/" + "c" * 255
    accented = "sub/" + "é" * 127  # 254 bytes

    assert write_file(workdir, longest, "long") == 4
    assert write_file(workdir, accented, "accented") == 8

    assert read_file(workdir, longest) == "long" and read_file(workdir, accented) == "accented"
    assert sorted(p.name for p in (workdir / "sub").iterdir()) == sorted(["c" * 255, "é" * 127])


def test_a_directory_swapped_for_a_symlink_mid_read_is_never_followed(layout: tuple[Path, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # A command renames a directory away and puts a symlink to the outside in its place, racing
    # read_file between its checks and its open. Opened through the path again, the symlink led to
    # a FIFO (or a device) outside: its writer woke before any check of the descriptor ran.
    workdir, outside = layout
    (workdir / "d").mkdir()
    (workdir / "d" / "f").write_text("inside")
    os.mkfifo(outside / "f")
    woken = threading.Event()

    def writer() -> None:
        with open(outside / "f", "w"):  # blocks until somebody opens the FIFO to read
            woken.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    checked = files._require_regular

    def swap_then_check(info: os.stat_result, path: str) -> None:
        if not (workdir / "d.old").exists():  # once: as the file is found regular, before it is opened
            (workdir / "d").rename(workdir / "d.old")
            (workdir / "d").symlink_to(outside)
        checked(info, path)

    monkeypatch.setattr(files, "_require_regular", swap_then_check)
    try:
        assert read_file(workdir, "d/f") == "inside"  # the directory the checks saw, renamed or not
        assert not woken.wait(0.5), "the FIFO outside the workdir was opened"
    finally:
        fd = os.open(outside / "f", os.O_RDONLY | os.O_NONBLOCK)  # lets the writer go
        thread.join(5)
        os.close(fd)
