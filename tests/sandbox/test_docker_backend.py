"""Docker-only behaviour: the live-container limit under concurrent claims, containers built
from other settings being recreated, and a command's output stream cut short on its way back.
The engine may be shared with other suites, whose containers count against the limit too: the
assertions hold whatever they do."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import docker.errors
import pytest

from persistence import sandbox_leases as leases
from persistence.settings import Settings
from sandbox.base import FLOODED, CommandResult, SandboxError, parse_user
from sandbox.docker_backend import LABEL_MANAGED, LABEL_TREE, TOMBSTONES, DockerBackend, _frames, tombstones_dir
from sandbox.manager import SandboxManager, choose_backend
from tests.sandbox.conftest import SandboxKit, insert_running_run, last_used, lease_of, made_room


def _live_managed(backend: DockerBackend) -> set[str]:
    found = backend.client.api.containers(
        quiet=True, filters={"label": f"{LABEL_MANAGED}=true", "status": ["running", "restarting", "paused"]}
    )
    return {str(row["Id"]) for row in found}


async def test_concurrent_claims_cannot_overshoot_the_container_limit(docker_kit: SandboxKit) -> None:
    """Three claims race for the one free place; each runs in a backend object of its own, as
    three processes would. At most one wins (plus one per container others removed meanwhile)."""
    assert isinstance(docker_kit.backend, DockerBackend)
    trees = [(await docker_kit.new_tree()) for _ in range(3)]
    before = _live_managed(docker_kit.backend)
    options = dataclasses.replace(docker_kit.options, max_containers=len(before) + 1)
    managers = [SandboxManager(docker_kit.db, docker_kit.new_backend(), 300, options) for _ in trees]

    outcomes = await asyncio.gather(
        *(manager.claim(tree, workdir) for manager, (tree, workdir) in zip(managers, trees, strict=True)),
        return_exceptions=True,
    )

    after = _live_managed(docker_kit.backend)
    ours = {str(outcome) for outcome in outcomes if isinstance(outcome, str)}
    removed_by_others = len(before - after)
    assert len(ours) <= 1 + removed_by_others, f"{len(ours)} claims got past a limit of {len(before) + 1}"
    for outcome in outcomes:
        if not isinstance(outcome, str):
            assert isinstance(outcome, SandboxError) and "CANOPY_SANDBOX_MAX_CONTAINERS" in str(outcome)
    for (tree, _), outcome in zip(trees, outcomes, strict=True):
        if not isinstance(outcome, str):
            assert docker_kit.backend.containers_for(tree) == []  # a refused claim created nothing
            assert not tombstones_dir(tree).exists()  # not even the directory of its tombstones


async def test_a_full_engine_releases_the_least_recently_used_idle_sandboxes(docker_kit: SandboxKit) -> None:
    """A claim that finds the engine full releases idle sandboxes, least recently used first, and
    never one whose tree has a running Run or that was claimed moments ago. The limit is one under
    the live count (two must go); other suites' containers may move it by one either way, hence
    three idle trees and the order asserted rather than the number."""
    assert isinstance(docker_kit.backend, DockerBackend)
    roomy = docker_kit.manager()
    names = ("oldest", "older", "old", "busy", "fresh")
    trees = {name: await docker_kit.new_tree() for name in names}
    for tree, workdir in trees.values():
        await roomy.claim(tree, workdir)
    await insert_running_run(docker_kit, trees["busy"][0])
    for name, hours in (("busy", 4), ("oldest", 3), ("older", 2), ("old", 1)):
        await last_used(docker_kit, trees[name][0], hours * 3600)
    options = dataclasses.replace(docker_kit.options, max_containers=len(_live_managed(docker_kit.backend)) - 1)
    tree, workdir = await docker_kit.new_tree()
    counted_before = await made_room(docker_kit, "engine")

    result = await SandboxManager(docker_kit.db, docker_kit.backend, 300, options).run_command(
        tree, workdir, "touch made.txt", 30
    )

    assert result.exit_code == 0 and (workdir / "made.txt").exists()
    states = {name: (await lease_of(docker_kit, trees[name][0])).state for name in names}
    assert states["busy"] == states["fresh"] == "active"
    released = [name for name in names[:3] if states[name] == "released"]
    assert released and released == list(names[: len(released)]), states  # least recently used first
    assert await made_room(docker_kit, "engine") == counted_before + len(released)
    for name in names:
        assert bool(docker_kit.backend.containers_for(trees[name][0])) == (name not in released)
    assert (trees["oldest"][1]).exists()  # a release keeps the workdir


async def test_every_slot_of_every_container_runs_a_command_at_once(docker_kit: SandboxKit) -> None:
    """The Docker backend the settings choose reads as many commands at once as the node's containers
    have slots: here 2 x 33 = 66, more than a pool of 64 held. The commands share a workdir and
    wait at a barrier for all 66 to have started; one left waiting for a stream thread never starts,
    and every one of them times out."""
    backend = choose_backend(Settings(sandbox_backend="docker", sandbox_max_containers=2, tree_slots=33))
    docker_kit.extra_backends.append(backend)
    shared = docker_kit.root / "shared"
    trees = [await docker_kit.new_tree(shared) for _ in range(2)]
    manager = SandboxManager(docker_kit.db, backend, 300, docker_kit.options)
    barrier = 'touch "b.$CANOPY_COMMAND_ID"; until [ "$(ls | grep -c "^b\\.")" -ge 66 ]; do sleep 1; done; echo through'

    results = await asyncio.gather(
        *(manager.run_command(tree, workdir, barrier, 90) for tree, workdir in trees for _ in range(33))
    )

    assert [(r.exit_code, r.timed_out, r.stdout) for r in results] == [(0, False, "through\n")] * 66
    assert len(list(shared.glob("b.*"))) == 66


async def test_a_container_built_from_other_settings_is_recreated(docker_kit: SandboxKit) -> None:
    assert isinstance(docker_kit.backend, DockerBackend)
    tree, workdir = await docker_kit.new_tree()
    old = await docker_kit.manager().claim(tree, workdir)

    changed = dataclasses.replace(docker_kit.options, pids=200)
    new = await SandboxManager(docker_kit.db, docker_kit.backend, 300, changed).claim(tree, workdir)

    assert new != old and not await docker_kit.backend.exists(old)
    assert docker_kit.backend.containers_for(tree) == [new]
    assert docker_kit.backend.client.containers.get(new).attrs["HostConfig"]["PidsLimit"] == 200


async def test_a_root_runtime_hands_the_workdir_to_the_sandbox_user(docker_kit: SandboxKit) -> None:
    if os.geteuid() != 0:
        pytest.skip("a non-root runtime runs sandbox commands as itself")
    tree, _ = await docker_kit.new_tree()
    workdir = docker_kit.root / f"fresh-{uuid.uuid4().hex[:8]}"  # made by the claim, as root

    result = await docker_kit.manager().run_command(tree, workdir, "echo x > made.txt && id -u && id -un", 30)

    uid, gid = parse_user(docker_kit.options.user)
    assert result.exit_code == 0 and result.stdout.split()[0] == str(uid)
    if docker_kit.options.user == "10001:10001":
        assert result.stdout.split()[1] == "canopy"  # the image (.ci/docker-up.sh) names the default user
    assert (workdir.stat().st_uid, workdir.stat().st_gid) == (uid, gid)
    assert (workdir / "made.txt").stat().st_uid == uid


async def test_a_root_user_is_refused_and_nothing_is_made(docker_kit: SandboxKit) -> None:
    assert isinstance(docker_kit.backend, DockerBackend)
    tree, workdir = await docker_kit.new_tree()
    root_options = dataclasses.replace(docker_kit.options, user="0:0")
    as_root = SandboxManager(docker_kit.db, docker_kit.backend, 300, root_options)

    with pytest.raises(SandboxError, match="never run as root"):
        await as_root.run_command(tree, workdir, "touch made.txt", 30)

    assert docker_kit.backend.containers_for(tree) == [] and not (workdir / "made.txt").exists()
    async with docker_kit.db.tx() as conn:
        assert await leases.get(conn, tree) is None


async def test_the_listing_of_sandboxes_survives_containers_removed_while_it_lists(docker_kit: SandboxKit) -> None:
    """A release or another node's sweeper may remove a container while this one lists them (the
    sweeper lists every managed container): the listing leaves it out, it does not fail."""
    backend = docker_kit.backend
    assert isinstance(backend, DockerBackend)
    trees = [uuid.uuid4() for _ in range(12)]
    made = [backend.client.api.create_container(docker_kit.options.image, command="true", labels={
        LABEL_MANAGED: "true", LABEL_TREE: str(tree)})["Id"] for tree in trees]

    def remove_all() -> None:
        for container in made:
            with contextlib.suppress(docker.errors.NotFound):
                backend.client.api.remove_container(container, force=True)

    removing = asyncio.create_task(asyncio.to_thread(remove_all))
    listings = []
    while not removing.done():
        listings.append(await backend.sandboxes())
    await removing
    listings.append(await backend.sandboxes())

    assert set(trees) & set(listings[0].values())  # it listed while they were being removed
    assert not set(trees) & set(listings[-1].values())  # and lists none once they are gone


@pytest.mark.timeout(900)
async def test_the_default_image_builds_and_runs_what_an_agent_expects(docker_kit: SandboxKit) -> None:
    """sandbox/image/build.sh makes the image ``canopy up`` uses by default; in the sandbox (read-only
    root, no capability, the sandbox user) it runs Python with pip and venv, git, and writes the workdir.
    The first build takes about a minute (Debian's mirror); the script keeps an image of its recipe's version."""
    image = Settings.model_fields["sandbox_image"].default
    build = Path(__file__).resolve().parents[2] / "sandbox" / "image" / "build.sh"
    built = await asyncio.to_thread(subprocess.run, ["bash", str(build), image], capture_output=True, text=True,
                                    timeout=1500)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    tree, workdir = await docker_kit.new_tree()
    options = dataclasses.replace(docker_kit.options, image=image)

    result = await SandboxManager(docker_kit.db, docker_kit.backend, 300, options).run_command(
        tree, workdir, "id -un; python3 -c 'import ssl, venv; print(6 * 7)'; git --version; python3 -m pip --version;"
        " echo made > made.txt", 120)

    assert result.exit_code == 0, result
    name, answer, git, pip = result.stdout.splitlines()
    assert (name, answer) == ("canopy", "42") and git.startswith("git version") and pip.startswith("pip ")
    assert (workdir / "made.txt").read_text() == "made\n"


class _ExecStreamProxy:
    """A TCP proxy to the Docker engine that tampers with the connection of an exec's output stream,
    as a connection under load would: in place of the bytes that hold ``cut_at`` it closes the
    connection (the client reads an end of stream) or resets it (the client's read fails), with
    ``split`` after passing on what comes before the middle of ``cut_at`` (a frame cut inside); with
    ``hold``, it passes the engine's reply on only once the engine ended it, in one write (a client
    too slow to read the reply's headers finds them with all of the output behind them)."""

    def __init__(self, *, cut_at: bytes | None = None, reset: bool = False, split: bool = False,
                 hold: bool = False) -> None:
        self._cut_at = cut_at
        self._reset = reset
        self._split = split
        self._hold = hold
        self._server: asyncio.Server | None = None
        self.cuts = 0
        self.held = 0

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"tcp://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
        engine_r, engine_w = await asyncio.open_unix_connection(engine)
        streaming = False  # this connection carries an exec's output

        async def requests() -> None:
            nonlocal streaming
            while data := await client_r.read(65536):
                streaming = streaming or re.search(rb"POST /\S*/exec/[0-9a-f]+/start ", data) is not None
                engine_w.write(data)
                await engine_w.drain()

        async def replies() -> None:
            held = bytearray()
            while data := await engine_r.read(65536):
                if streaming and self._hold:
                    held += data
                    continue
                if streaming and self._cut_at is not None and self._cut_at in data:
                    self.cuts += 1
                    if self._split:
                        client_w.write(data[:data.index(self._cut_at) + len(self._cut_at) // 2])
                        await client_w.drain()
                    if self._reset:
                        client_w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                      struct.pack("ii", 1, 0))
                        client_w.transport.abort()
                    else:
                        client_w.close()
                    return
                client_w.write(data)
                await client_w.drain()
            if held:
                self.held += 1
                client_w.write(held)
                await client_w.drain()

        # Either side's end ends the connection (the engine ends an exec's stream by closing it).
        directions = {asyncio.ensure_future(requests()), asyncio.ensure_future(replies())}
        await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
        for direction in directions:
            direction.cancel()
        engine_w.close()
        client_w.close()


async def _run_through(proxy: _ExecStreamProxy, handle: str, command: str) -> CommandResult:
    async with proxy as base_url:
        # A thread: the client asks the engine's version at once, through the proxy this loop serves.
        proxied = DockerBackend(await asyncio.to_thread(docker.DockerClient, base_url=base_url))
        try:
            return await proxied.run(handle, command, 30, f"proxied-{uuid.uuid4().hex}")
        finally:
            proxied.close()


@pytest.mark.parametrize(("command", "reset", "split", "exit_code", "stdout"), [
    ("echo first; sleep 3; echo second > late.txt", False, False, 137, ""),  # cut while the command runs on
    ("echo first; echo second > late.txt", True, False, 0, ""),  # cut after it ended, before its output was read
    ("echo first; echo second > late.txt", False, True, 0, "fi"),  # cut inside a frame, after it ended
])
async def test_an_output_stream_cut_short_is_said_and_its_command_stopped(
        docker_kit: SandboxKit, command: str, reset: bool, split: bool, exit_code: int, stdout: str) -> None:
    """The output of a command comes back on one connection to the engine. One cut short was taken
    for the whole output, and a command still running when it was cut ran on unsupervised, its
    result saying it was killed: the model read a short (here empty) output as the command's own."""
    tree, workdir = await docker_kit.new_tree()
    handle = await docker_kit.backend.ensure(tree, workdir, docker_kit.options)
    cutter = _ExecStreamProxy(cut_at=b"first", reset=reset, split=split)
    result = await _run_through(cutter, handle, command)
    assert cutter.cuts == 1
    assert (result.exit_code, result.stdout) == (exit_code, stdout), result
    assert "[canopy: the command's output was cut short" in result.stderr, result
    await asyncio.sleep(4)  # past the running command's end, had it been left to run
    assert (workdir / "late.txt").exists() == (exit_code == 0)


def _frame(stream_id: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream_id, len(data)) + data


class _Trickle(io.RawIOBase):
    """A stream that gives one byte per read, and has no ``read1``: short reads everywhere."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._data.read(1)


_WHOLE = _frame(1, b"out") + _frame(2, b"") + _frame(2, b"err") + _frame(3, b"?")


@pytest.mark.parametrize("make", [io.BytesIO, _Trickle], ids=["buffered", "trickle"])
@pytest.mark.parametrize(("wire", "read", "ended_inside"), [
    (_WHOLE, [(1, b"out"), (2, b"err"), (3, b"?")], None),
    (b"", [], None),
    (_frame(1, b"out") + _frame(2, b"err")[:5], [(1, b"out")], "header"),  # ended inside a frame's header
    (_frame(1, b"out") + _frame(2, b"error")[:10], [(1, b"out"), (2, b"er")], "frame's end"),  # inside its payload
])
def test_output_frames_are_read_whole_and_an_end_inside_one_is_an_error(
        make: Callable[[bytes], BinaryIO], wire: bytes, read: list[tuple[int, bytes]],
        ended_inside: str | None) -> None:
    """The engine ends an exec's stream between two frames: an end inside one is a stream cut short,
    never taken for the whole output."""
    got: list[tuple[int, bytes]] = []

    def take_all() -> None:
        for stream_id, data in _frames(make(wire)):
            if got and got[-1][0] == stream_id:  # a frame's chunks come as they arrive
                got[-1] = (stream_id, got[-1][1] + data)
            else:
                got.append((stream_id, data))

    if ended_inside is None:
        take_all()
    else:
        with pytest.raises(EOFError, match=ended_inside):
            take_all()
    assert got == read


async def test_output_that_came_with_the_streams_headers_is_kept(docker_kit: SandboxKit) -> None:
    """A client slow to read the engine's reply to an exec's start (a loaded host) finds the reply's
    headers with the output behind them, and the HTTP client reads ahead as it reads the headers. The
    output was read from the socket beneath, after those bytes: a command that printed came back
    with exit code 0 and no output at all, and the model was told the command printed nothing."""
    tree, workdir = await docker_kit.new_tree()
    handle = await docker_kit.backend.ensure(tree, workdir, docker_kit.options)
    holder = _ExecStreamProxy(hold=True)

    result = await _run_through(holder, handle, r"echo out; printf 'err\000' >&2; echo more")

    assert holder.held == 1
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\nmore\n", "err\ufffd"), result


async def test_what_a_command_writes_to_the_containers_stdout_fills_no_log_on_the_host(
        docker_kit: SandboxKit) -> None:
    """A command can write to pid 1's stdout (``/proc/1/fd/1``, the sandbox user's own process):
    the engine's default log driver kept every byte of it in a file on the host, without bound,
    so a hostile command could fill the host's disk (and the database on it). Canopy never reads
    a container's log: the container keeps none."""
    backend = docker_kit.backend
    assert isinstance(backend, DockerBackend)
    tree, workdir = await docker_kit.new_tree()
    handle = await backend.ensure(tree, workdir, docker_kit.options)

    flood = "yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 4000000 > /proc/1/fd/1 && echo flooded"
    result = await backend.run(handle, flood, 60, f"flood-{uuid.uuid4().hex}")

    assert (result.exit_code, result.stdout) == (0, "flooded\n"), result  # the write itself is possible
    attrs = backend.client.api.inspect_container(handle)
    log_path = attrs.get("LogPath") or ""  # the engine's file of the container's log, on its host
    if log_path and os.path.exists(log_path):
        assert os.path.getsize(log_path) == 0, f"{os.path.getsize(log_path)} bytes kept in {log_path}"
    elif log_path and not os.access(os.path.dirname(log_path), os.X_OK):
        pytest.fail(f"cannot read the engine's log dir {os.path.dirname(log_path)} to check the log file")
    assert attrs["HostConfig"]["LogConfig"]["Type"] == "none"


async def test_the_memory_limit_is_not_doubled_by_swap(docker_kit: SandboxKit) -> None:
    """A memory limit without a swap limit lets the engine grant as much swap again."""
    backend = docker_kit.backend
    assert isinstance(backend, DockerBackend)
    tree, workdir = await docker_kit.new_tree()
    handle = await backend.ensure(tree, workdir, docker_kit.options)

    host_config = backend.client.api.inspect_container(handle)["HostConfig"]

    assert host_config["Memory"] == 256 * 1024 * 1024  # sandbox_options(): memory="256m"
    assert host_config["MemorySwap"] == host_config["Memory"]




@pytest.mark.parametrize(("bomb", "timeout"), [
    # It ends by itself (the shell dies when it cannot fork), leaving the processes behind.
    ("while :; do setsid sleep 1000 & done", 30),
    # It waits, and is stopped by its timeout: the kill's search for processes cannot fork.
    ("sh -c 'while :; do setsid sleep 1000 & done' 2>/dev/null; exec sleep 1000", 3),
])
async def test_a_command_filling_the_process_limit_is_stopped_with_every_process_it_left(
        docker_kit: SandboxKit, bomb: str, timeout: float) -> None:
    """Processes that left a command's group are found by a search that forks, and every command
    forks: processes filling the container's process limit ran on after their command ended or was
    stopped, and no later command could fork (until the sandbox was released as idle, which the
    failing commands put off). The container is now restarted: every process in it stops, the
    workdir stays, and the commands that were running are told why they ended."""
    backend = docker_kit.backend
    assert isinstance(backend, DockerBackend)
    tree, workdir = await docker_kit.new_tree()
    manager = SandboxManager(docker_kit.db, backend, 300, dataclasses.replace(docker_kit.options, pids=32))
    kept = await manager.run_command(tree, workdir, "echo kept > kept.txt", 30)
    beside = asyncio.create_task(manager.run_command(tree, workdir, "sleep 20; echo beside-done", 60))
    await asyncio.sleep(0.5)

    result = await manager.run_command(tree, workdir, bomb, timeout)
    after = await manager.run_command(tree, workdir, "echo $(echo forked)", 30)
    beside_result = await asyncio.wait_for(beside, 30)

    assert kept.exit_code == 0
    assert result.exit_code != 0 and result.timed_out == (timeout < 30), result
    assert "process limit (32) was full" in result.stderr, result
    assert (after.exit_code, after.stdout) == (0, "forked\n"), after
    handle = await manager.claim(tree, workdir)
    left = [row[-1] for row in backend.client.api.top(handle)["Processes"] if "sleep 1000" in row[-1]]
    assert left == [], f"{len(left)} processes of the stopped command still run"
    assert (workdir / "kept.txt").read_text() == "kept\n"
    assert (beside_result.exit_code, beside_result.stdout) == (137, ""), beside_result
    assert "process limit (32) was full" in beside_result.stderr, beside_result


async def test_a_kills_tombstone_outlives_a_restart_and_the_sandbox_user(docker_kit: SandboxKit) -> None:
    """A kill leaves a tombstone, so that the command, started late by a Run that lost its lease on
    its way, never runs. It was kept in the container's /tmp: a restart of the container (its
    process limit full, or the engine restarted) emptied it and the late start ran the command in
    full, and the sandbox user could delete it. It is kept on the host now, read-only inside, and
    goes with the container."""
    backend = docker_kit.backend
    assert isinstance(backend, DockerBackend)
    tree, workdir = await docker_kit.new_tree()
    handle = await backend.ensure(tree, workdir, docker_kit.options)
    command_id = f"late-{uuid.uuid4().hex}"
    assert await docker_kit.new_backend().kill(handle, command_id) is False  # nothing ran yet: nothing to kill

    erase = f"rm -f {TOMBSTONES}/{command_id}.killed /tmp/.canopy/{command_id}.killed; ls {TOMBSTONES}"
    erased = await backend.run(handle, erase, 30, f"erase-{uuid.uuid4().hex}")
    await asyncio.to_thread(backend.client.api.restart, handle, timeout=0)
    late = await backend.run(handle, "echo ran > late.txt; echo ran", 30, command_id)

    assert command_id in erased.stdout, erased  # still there after the sandbox user's rm
    assert (late.exit_code, late.stdout) == (137, ""), late
    await asyncio.sleep(0.5)
    assert not (workdir / "late.txt").exists()
    other = await backend.run(handle, "echo ran > other.txt", 30, f"other-{uuid.uuid4().hex}")
    assert other.exit_code == 0 and (workdir / "other.txt").read_text() == "ran\n"

    assert tombstones_dir(tree).is_dir()
    await backend.release(handle)
    assert not tombstones_dir(tree).exists()  # a new sandbox of the tree starts without tombstones


async def test_the_tombstones_of_a_container_removed_outside_canopy_are_removed(docker_kit: SandboxKit) -> None:
    """A container removed with ``docker rm`` left its tree's tombstones directory in the temp dir
    for good; the orphan sweep removes it, and leaves those of live containers alone."""
    assert isinstance(docker_kit.backend, DockerBackend)
    (gone, gone_workdir), (kept, kept_workdir) = await docker_kit.new_tree(), await docker_kit.new_tree()
    manager = docker_kit.manager()
    handle = await manager.claim(gone, gone_workdir)
    await manager.claim(kept, kept_workdir)
    await docker_kit.backend.kill(handle, "cmd-1")
    assert (tombstones_dir(gone) / "cmd-1.killed").exists()
    docker_kit.backend.client.containers.get(handle).remove(force=True)

    await manager.reap_orphans()

    assert not tombstones_dir(gone).exists()
    assert tombstones_dir(kept).is_dir()


async def test_command_ids_dot_and_dotdot_are_ids_like_any_other(docker_kit: SandboxKit) -> None:
    """``.`` and ``..`` are valid command ids; as tombstone names they were the directory itself
    and its parent, which always exist: every command of such an id exited as killed."""
    backend = docker_kit.backend
    tree, workdir = await docker_kit.new_tree()
    handle = await backend.ensure(tree, workdir, docker_kit.options)
    ran = {command_id: await backend.run(handle, f"echo ran {command_id}", 30, command_id)
           for command_id in (".", "..")}
    assert {key: (result.exit_code, result.stdout) for key, result in ran.items()} == {
        ".": (0, "ran .\n"), "..": (0, "ran ..\n")}
    await backend.kill(handle, "..")
    assert (await backend.run(handle, "echo again", 30, "..")).exit_code == 137  # killed: never again
    assert (await backend.run(handle, "echo again", 30, ".")).exit_code == 0


async def test_a_planted_tombstones_parent_is_never_followed(docker_kit: SandboxKit, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The tombstones' parent lives in the shared temp dir. Replaced by another user's symlink (after
    a reboot emptied the temp dir, say), it is never followed: a kill writes nothing through it, a
    release deletes nothing through it, and a new sandbox is refused, naming the directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "shared-tmp"))
    (tmp_path / "shared-tmp").mkdir()
    backend = docker_kit.new_backend()
    tree, workdir = await docker_kit.new_tree()
    handle = await backend.ensure(tree, workdir, docker_kit.options)
    parent = tombstones_dir(tree).parent
    assert parent.parent == tmp_path / "shared-tmp" and oct(parent.stat().st_mode & 0o777) == "0o700"
    victim = tmp_path / "victim"
    (victim / str(tree)).mkdir(parents=True)
    (victim / str(tree) / "precious").write_text("kept")
    await asyncio.to_thread(shutil.rmtree, parent)
    parent.symlink_to(victim)

    await backend.kill(handle, "cmd-1")
    await backend.release(handle)
    with pytest.raises(SandboxError, match="belongs to another user"):
        await backend.ensure(tree, workdir, docker_kit.options)

    assert sorted(path.name for path in (victim / str(tree)).iterdir()) == ["precious"]
    assert backend.containers_for(tree) == []


async def test_a_flood_is_stopped_while_every_stream_thread_reads(docker_kit: SandboxKit) -> None:
    # The stop of a flooding command waited for a thread of the pool that reads the commands'
    # streams, the flooding one's included: with every thread reading (a node's long commands),
    # `yes` ran on until its timeout, the host's CPU carrying every byte.
    backend = DockerBackend(max_commands=1)
    docker_kit.extra_backends.append(backend)
    tree, workdir = await docker_kit.new_tree()
    handle = await backend.ensure(tree, workdir, docker_kit.options)
    result = await backend.run(handle, "yes", 60, f"flood-{uuid.uuid4().hex}")
    assert (result.exit_code, result.timed_out) == (137, False), result.stderr[-300:]  # a flood, not a timeout
    assert result.stderr.endswith(FLOODED), result.stderr[-300:]
