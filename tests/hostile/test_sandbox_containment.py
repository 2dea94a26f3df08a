"""A hostile model's commands and file calls stay inside the sandbox, or are refused.

Model output is untrusted: a command is whatever the model wrote, a path is whatever it
named. Each test plays one hostile move and reads back durable facts (``docker inspect``,
processes, files, lease rows). A refusal must change nothing: no lease row, no container,
no file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import stat
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from persistence.db import Database
from persistence.settings import Settings
from sandbox.base import PathRejected, SandboxError
from sandbox.docker_backend import DockerBackend, container_name
from sandbox.files import read_file, write_file
from sandbox.manager import SandboxManager
from tests.sandbox import conftest as sandbox_suite
from tests.sandbox.conftest import SandboxKit, new_tree

# The sandbox suite's fixtures, for these tests too (pytest finds fixtures among module globals).
sandbox_database_url = sandbox_suite.sandbox_database_url
sandbox_db = sandbox_suite.sandbox_db
docker_backend_or_skip = sandbox_suite.docker_backend_or_skip
docker_kit = sandbox_suite.docker_kit


async def _lease_rows(db: Database, tree_id: uuid.UUID) -> list[dict[str, object]]:
    async with db.tx() as conn:
        cur = await conn.execute("SELECT state, handle FROM sandbox_leases WHERE tree_id = %s", (tree_id,))
        return list(await cur.fetchall())


def _labelled_containers(tree_id: uuid.UUID) -> list[str]:
    """``docker ps -a`` with the tree's label, as an operator would look."""
    return subprocess.run(
        ["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"label=canopy.tree_id={tree_id}"],
        check=True, capture_output=True, text=True,
    ).stdout.split()


async def test_no_docker_engine_runs_nothing_on_the_host(
    sandbox_db: Database,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Without an engine, a command must not silently run on the host as the Canopy user."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # nothing listens here
    monkeypatch.delenv("CANOPY_SANDBOX_BACKEND", raising=False)
    tree, workdir = await new_tree(sandbox_db, tmp_path)
    manager = SandboxManager.from_settings(sandbox_db, Settings())
    try:
        with pytest.raises(SandboxError, match="CANOPY_SANDBOX_BACKEND=local") as raised:
            await manager.run_command(tree, workdir, "touch escaped.txt; echo $$ > pid.txt")
    finally:
        manager.close()

    assert "Docker" in str(raised.value)
    assert sorted(p.name for p in workdir.iterdir()) == []
    assert await _lease_rows(sandbox_db, tree) == []


async def test_the_container_is_hardened(docker_kit: SandboxKit) -> None:
    """Read back from the engine, then probed from inside by the commands a hostile model would try."""
    assert isinstance(docker_kit.backend, DockerBackend)
    manager = docker_kit.manager()
    tree, workdir = await docker_kit.new_tree()
    handle = await manager.claim(tree, workdir)
    attrs = docker_kit.backend.client.containers.get(handle).attrs
    host = attrs["HostConfig"]

    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert host["ReadonlyRootfs"] is True
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none"
    assert host["PidsLimit"] == docker_kit.options.pids and host["Memory"] == 256 * 1024 * 1024
    assert host["NanoCpus"] > 0
    assert host["Privileged"] is False
    assert set(host["Tmpfs"]) == {"/tmp"} and "size=64m" in host["Tmpfs"]["/tmp"]
    uid, _, gid = attrs["Config"]["User"].partition(":")
    assert uid and int(uid) != 0 and gid and int(gid) != 0

    probes = {
        "uid": "id -u",
        "etc": "touch /etc/pwned",
        "bin": "echo pwned > /bin/pwned",
        "mknod": "mknod /tmp/disk b 8 0",
        "chown": "touch owned && chown 0:0 owned",
        "caps": "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status",
        "tmp": 'echo ok > /tmp/ok && cat /tmp/ok && ls -d "$CANOPY_TMP/.canopy"',
        "workspace": "echo ok > ws.txt && cat ws.txt",
    }
    results = {name: await manager.run_command(tree, workdir, command, 30) for name, command in probes.items()}

    assert int(results["uid"].stdout) != 0
    for name in ("etc", "bin", "mknod", "chown"):
        assert results[name].exit_code != 0, f"{name} succeeded: {results[name]}"
    assert results["caps"].stdout.split() == [
        "CapEff:", "0000000000000000", "CapBnd:", "0000000000000000", "NoNewPrivs:", "1"
    ]
    assert results["tmp"].stdout == "ok\n/tmp/.canopy\n"  # the command wrapper's pid files live here
    assert results["workspace"].stdout == "ok\n" and (workdir / "ws.txt").read_text() == "ok\n"
    assert (workdir / "owned").stat().st_uid == int(uid)  # chown failed: still the sandbox user's
    assert not os.path.exists("/etc/pwned") and not os.path.exists("/bin/pwned")


@pytest.mark.parametrize("labels", ["none", "another-tree"])
async def test_a_container_canopy_did_not_make_for_the_tree_is_not_adopted(
    docker_kit: SandboxKit, labels: str
) -> None:
    assert isinstance(docker_kit.backend, DockerBackend)
    client = docker_kit.backend.client
    tree, workdir = await docker_kit.new_tree()
    workdir_owner = (workdir.stat().st_uid, workdir.stat().st_gid)
    squatter_labels = {} if labels == "none" else {"canopy.managed": "true", "canopy.tree_id": str(uuid.uuid4())}
    squatter = client.containers.run(
        docker_kit.options.image, ["sleep", "infinity"], name=container_name(tree), labels=squatter_labels,
        detach=True, network_mode="none",
    )
    labels_before = dict(squatter.labels)
    try:
        # Started: `docker run` returns while runc may still be starting the command (read after the
        # refusal, `top` then showed "runc init" instead of the one process it checks for).
        for _ in range(100):
            if [process[-1] for process in squatter.top()["Processes"]] == ["sleep infinity"]:
                break
            await asyncio.sleep(0.1)
        with pytest.raises(SandboxError, match="did not make") as raised:
            await docker_kit.manager().run_command(tree, workdir, "touch adopted.txt", 30)

        assert container_name(tree) in str(raised.value)
        squatter.reload()
        assert squatter.status == "running" and squatter.labels == labels_before  # untouched
        named = client.containers.list(all=True, filters={"name": f"^{container_name(tree)}$"})
        assert [c.id for c in named] == [squatter.id]
        assert _labelled_containers(tree) == []
        assert await _lease_rows(docker_kit.db, tree) == []
        assert list(workdir.iterdir()) == [] and (workdir.stat().st_uid, workdir.stat().st_gid) == workdir_owner
        top = squatter.top()["Processes"]
        assert len(top) == 1 and "sleep" in top[0][-1]  # nothing was executed in it
    finally:
        squatter.remove(force=True)


def _special_node(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()


def _node_facts(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_ino, stat.S_IFMT(info.st_mode), info.st_size


@pytest.mark.parametrize("kind", ["fifo", "chardev", "socket"])
async def test_special_files_are_refused_by_read_and_write(tmp_path: Path, kind: str) -> None:
    """A FIFO (or device, or socket) a command planted in the workdir: refused at once, left as it was."""
    if kind == "chardev" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    node = workdir / "planted"
    _special_node(kind, node)
    before = _node_facts(node)
    # A FIFO's writer blocks until a reader opens it: opening it at all would wake this one.
    writer_opened = threading.Event()
    if kind == "fifo":
        def writer() -> None:
            fd = os.open(node, os.O_WRONLY)
            writer_opened.set()
            os.close(fd)
        threading.Thread(target=writer, daemon=True).start()

    with pytest.raises(PathRejected, match="not a regular file"):
        await asyncio.wait_for(asyncio.to_thread(read_file, workdir, "planted"), 10)
    with pytest.raises(PathRejected, match="not a regular file"):
        await asyncio.wait_for(asyncio.to_thread(write_file, workdir, "planted", "pwned"), 10)

    assert _node_facts(node) == before
    assert sorted(p.name for p in workdir.iterdir()) == ["planted"]  # no temp file left behind
    assert not writer_opened.wait(0.3), "read_file or write_file opened the FIFO"
    if kind == "fifo":  # let the writer go
        os.close(os.open(node, os.O_RDONLY | os.O_NONBLOCK))


async def test_live_container_limit_refuses_and_creates_nothing(docker_kit: SandboxKit) -> None:
    """A hostile fan-out of trees cannot start containers without bound on the host. When too few
    sandboxes are idle to make room, none is released: a refused claim changes nothing."""
    roomy = docker_kit.manager()
    running_tree, running_workdir = await docker_kit.new_tree()
    idle_tree, idle_workdir = await docker_kit.new_tree()
    await roomy.claim(running_tree, running_workdir)  # at least two managed containers run now
    await roomy.claim(idle_tree, idle_workdir)
    await sandbox_suite.insert_running_run(docker_kit, running_tree)
    await sandbox_suite.last_used(docker_kit, running_tree, 3600)
    await sandbox_suite.last_used(docker_kit, idle_tree, 3600)
    limited = SandboxManager(
        docker_kit.db, docker_kit.backend, 300, dataclasses.replace(docker_kit.options, max_containers=1)
    )
    tree, workdir = await docker_kit.new_tree()

    with pytest.raises(SandboxError, match="CANOPY_SANDBOX_MAX_CONTAINERS") as raised:
        await limited.run_command(tree, workdir, "touch made.txt", 30)

    assert "limit of 1 " in str(raised.value)
    assert _labelled_containers(tree) == []
    assert await _lease_rows(docker_kit.db, tree) == []
    assert not (workdir / "made.txt").exists()
    for kept in (running_tree, idle_tree):  # the busy one, and the idle one that alone made too little room
        assert len(_labelled_containers(kept)) == 1
        assert [row["state"] for row in await _lease_rows(docker_kit.db, kept)] == ["active"]
