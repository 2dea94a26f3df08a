"""The sandbox conformance suite: every backend passes the same tests (see conftest ``sandbox``).

Everything asserts read-back facts: files on disk, lease rows in PostgreSQL, processes in
/proc or in the container, containers in the engine. Commands use ``$CANOPY_TMP`` for the
tree's scratch dir (``/tmp`` in Docker, a per-tree dir locally).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from persistence import sandbox_leases as leases
from sandbox.base import (
    FLOODED,
    OUTPUT_LIMIT_BYTES,
    OUTPUT_STOP_BYTES,
    TRUNCATION_MARKER,
    CommandResult,
    SandboxBackend,
    SandboxGone,
)
from sandbox.docker_backend import TOMBSTONES, DockerBackend, container_name, tombstones_dir
from sandbox.files import read_file, write_file
from sandbox.local_backend import LocalBackend
from sandbox.manager import SandboxManager
from tests.sandbox.conftest import GatedBackend, SandboxKit, insert_running_run, lease_of, open_transactions

# Prints "alive" or "dead" for the pid stored in a file; a zombie counts as dead.
_PID_STATE = (
    'p=$(cat "{file}"); if [ -d /proc/$p ] && ! grep -q "^State:.*Z" /proc/$p/status; '
    "then echo alive; else echo dead; fi"
)
# The pid file appears whole, by a rename: a shell stopped between creating the file and writing its
# pid would leave an empty file, which names no process to check.
_PID_THEN_SLEEP = (
    'echo $$ > "$CANOPY_TMP/{name}.tmp"; mv "$CANOPY_TMP/{name}.tmp" "$CANOPY_TMP/{name}.pid"; exec sleep 30'
)


async def _run(manager: SandboxManager, tree: uuid.UUID, workdir: Path, command: str) -> CommandResult:
    return await manager.run_command(tree, workdir, command, timeout_seconds=30)


async def _wait_for_file(manager: SandboxManager, tree: uuid.UUID, workdir: Path, path: str) -> str:
    for _ in range(100):
        result = await _run(manager, tree, workdir, f'cat "{path}" 2>/dev/null')
        if result.exit_code == 0 and result.stdout.strip():
            return result.stdout.strip()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _host_process_alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except OSError:
        return False


async def test_workdir_is_shared_between_commands(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()

    written = await _run(manager, tree, workdir, "mkdir -p out && echo hello > out/shared.txt")
    read = await _run(manager, tree, workdir, "cat out/shared.txt; pwd")

    assert written.exit_code == 0 and read.exit_code == 0
    expected_cwd = "/workspace" if sandbox.kind == "docker" else str(workdir.resolve())
    assert read.stdout.splitlines() == ["hello", expected_cwd]
    assert (workdir / "out" / "shared.txt").read_text() == "hello\n"  # on the host, in the project
    lease = await lease_of(sandbox, tree)
    assert (lease.state, lease.backend) == ("active", sandbox.kind)


async def test_tmp_is_shared_within_a_tree_and_private_to_it(sandbox: SandboxKit) -> None:
    # Members live in different actor processes: each has its own manager and backend object.
    parent = sandbox.manager()
    child = SandboxManager(sandbox.db, sandbox.new_backend(), 300, sandbox.options)
    tree, workdir = await sandbox.new_tree()
    other_tree, _ = await sandbox.new_tree(workdir)  # another root of the same project

    await _run(parent, tree, workdir, 'echo from-parent > "$CANOPY_TMP/marker"')
    sibling = await _run(child, tree, workdir, 'cat "$CANOPY_TMP/marker"')
    stranger = await _run(child, other_tree, workdir, 'cat "$CANOPY_TMP/marker"')

    assert (sibling.exit_code, sibling.stdout) == (0, "from-parent\n")
    assert stranger.exit_code != 0 and stranger.stdout == ""
    assert not (workdir / "marker").exists()
    if sandbox.kind == "docker":
        literal = await _run(child, tree, workdir, "cat /tmp/marker")
        assert literal.stdout == "from-parent\n"  # in Docker the tree's /tmp is /tmp itself


async def test_background_processes_outlive_their_command(sandbox: SandboxKit) -> None:
    parent = sandbox.manager()
    child = SandboxManager(sandbox.db, sandbox.new_backend(), 300, sandbox.options)
    tree, workdir = await sandbox.new_tree()

    started = time.monotonic()
    background = 'nohup sleep 60 >/dev/null 2>&1 & echo $! > "$CANOPY_TMP/bg.pid"'
    launch = await _run(parent, tree, workdir, background)
    launch_seconds = time.monotonic() - started
    seen = await _run(child, tree, workdir, _PID_STATE.format(file="$CANOPY_TMP/bg.pid"))

    assert launch.exit_code == 0 and launch_seconds < 5
    assert seen.stdout == "alive\n"


async def test_a_commands_processes_are_the_kernels_first_choice_when_memory_runs_out(sandbox: SandboxKit) -> None:
    """A sandbox's memory limit bounds each sandbox, not all of them together (32 of 2 GiB may run on a
    node of 16): when the node runs out, the kernel kills the process it scores highest, and a
    model's command must go before the database, Ray or Canopy."""
    tree, workdir = await sandbox.new_tree()
    result = await _run(sandbox.manager(), tree, workdir,
                        'cat /proc/self/oom_score_adj; sh -c "cat /proc/self/oom_score_adj" & wait')
    assert result.stdout.split() == ["1000", "1000"], result
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # not the runtime's own


async def test_cancel_kills_only_that_command(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    long_command = 'sleep 30 & echo $! > "$CANOPY_TMP/child.pid"; wait; echo finished > done.txt'
    long_task = asyncio.create_task(_run(manager, tree, workdir, long_command))
    child_pid = await _wait_for_file(manager, tree, workdir, "$CANOPY_TMP/child.pid")
    sibling_task = asyncio.create_task(_run(manager, tree, workdir, "sleep 1.5; echo sibling-done"))
    await asyncio.sleep(0.3)

    started = time.monotonic()
    long_task.cancel()
    done, _ = await asyncio.wait({long_task}, timeout=2)
    cancel_seconds = time.monotonic() - started

    assert done == {long_task} and long_task.cancelled(), "the cancelled command did not end within 2 s"
    state = await _run(manager, tree, workdir, _PID_STATE.format(file="$CANOPY_TMP/child.pid"))
    assert state.stdout.strip() == "dead", f"child {child_pid} of the cancelled command survived"
    sibling = await sibling_task
    assert (sibling.exit_code, sibling.stdout) == (0, "sibling-done\n")
    assert not (workdir / "done.txt").exists()
    after = await _run(manager, tree, workdir, "echo still-here")
    assert after.stdout == "still-here\n"  # the sandbox itself lives on
    assert cancel_seconds < 2


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.2])
async def test_cancel_right_after_start_leaves_nothing_running(sandbox: SandboxKit, delay: float) -> None:
    """Cancelling before the command has even started must not let it start later."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await manager.claim(tree, workdir)
    task = asyncio.create_task(_run(manager, tree, workdir, _PID_THEN_SLEEP.format(name="early")))
    await asyncio.sleep(delay)

    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    await asyncio.sleep(0.5)  # a command that slipped through would have written its pid by now

    assert done == {task}, "the cancellation did not end the task within 2 s"
    pid_state = _PID_STATE.format(file="$CANOPY_TMP/early.pid")
    check = f'if [ -e "$CANOPY_TMP/early.pid" ]; then {pid_state}; else echo never-started; fi'
    state = await _run(manager, tree, workdir, check)
    assert state.stdout.strip() in {"dead", "never-started"}


async def test_output_over_64k_is_truncated_with_a_marker(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    size = 200_000

    result = await _run(manager, tree, workdir, f"yes abcdefg | head -c {size}; yes xyz | head -c {size} >&2")

    for text, unit in ((result.stdout, "abcdefg\n"), (result.stderr, "xyz\n")):
        head, marker_and_tail = text.split("\n" + TRUNCATION_MARKER, 1)
        marker, tail = marker_and_tail.split("]\n", 1)
        assert f"{size - OUTPUT_LIMIT_BYTES} of {size} bytes omitted" in marker
        assert len(head) + len(tail) == OUTPUT_LIMIT_BYTES
        assert head.startswith(unit * 3) and set(tail) <= set(unit)
    assert result.exit_code == 0


@pytest.mark.parametrize("stream", ["", ">&2"])
async def test_a_command_flooding_its_output_is_stopped(sandbox: SandboxKit, stream: str) -> None:
    """Only 64 KiB of an output are kept, but every byte was carried by the engine and read by the
    runtime, on the host's CPU, outside the sandbox's limits: `yes` under a long timeout ran a core
    of the host for the whole timeout. Past OUTPUT_STOP_BYTES a command is stopped, and says so."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()

    result = await manager.run_command(
        tree, workdir, f"head -c {2 * OUTPUT_STOP_BYTES} /dev/zero {stream}; echo on > after.txt",
        timeout_seconds=120)

    assert (result.exit_code, result.timed_out) == (137, False), result.exit_code
    assert result.stderr.endswith(FLOODED), result.stderr[-300:]
    await asyncio.sleep(0.5)
    assert not (workdir / "after.txt").exists()
    assert (await _run(manager, tree, workdir, "echo fine")).stdout == "fine\n"  # the sandbox goes on


async def test_binary_output_and_files_are_storable_text(sandbox: SandboxKit) -> None:
    """A NUL byte (PostgreSQL's text and jsonb cannot hold one) and bytes that are not UTF-8 are
    U+FFFD in a command's output and in a file read, whatever printed or wrote them."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()

    result = await _run(manager, tree, workdir, r"printf 'a\000b\377'; printf 'c\000d' >&2; printf 'e\000f' > bin")

    assert (result.exit_code, result.stdout, result.stderr) == (0, "a\ufffdb\ufffd", "c\ufffdd")
    assert read_file(workdir, "bin") == "e\ufffdf"


async def test_exit_code_stderr_and_timeout(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()

    failed = await _run(manager, tree, workdir, "echo out; echo err >&2; exit 3")
    started = time.monotonic()
    slow = await manager.run_command(tree, workdir, "echo begun; sleep 20", timeout_seconds=0.5)
    elapsed = time.monotonic() - started

    assert (failed.exit_code, failed.stdout, failed.stderr, failed.timed_out) == (3, "out\n", "err\n", False)
    assert failed.as_tool_result() == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n"}
    assert slow.timed_out and slow.exit_code == 137 and slow.stdout == "begun\n"
    assert elapsed < 4


async def test_a_timeout_returns_while_an_escaped_process_holds_the_output(sandbox: SandboxKit) -> None:
    """A process that left the command's group (setsid) keeps its output open after the timeout's
    kill: the local backend then waited for the command's exit, which asyncio reports only once
    every pipe is closed, so the Run hung past its timeout until a human cancelled it."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    result = await asyncio.wait_for(manager.run_command(tree, workdir, "echo begun; setsid sleep 60 & sleep 60",
                                                        timeout_seconds=1), 30)
    assert (result.timed_out, result.stdout) == (True, "begun\n"), result


async def test_idle_release_keeps_workdir_and_drops_tmp_and_processes(sandbox: SandboxKit) -> None:
    manager = sandbox.manager(idle_seconds=0.2)
    tree, workdir = await sandbox.new_tree()
    await _run(
        manager,
        tree,
        workdir,
        'echo kept > kept.txt; echo t > "$CANOPY_TMP/marker"; '
        # One background process in the command's group, one that left it (setsid).
        "nohup sleep 300 >/dev/null 2>&1 & echo $! > bg.pid; "
        "setsid sleep 301 >/dev/null 2>&1 & echo $! >> bg.pid",
    )
    old_handle = (await lease_of(sandbox, tree)).handle
    bg_pids = [int(line) for line in (workdir / "bg.pid").read_text().split()]
    if sandbox.kind == "local":
        assert all(_host_process_alive(pid) for pid in bg_pids)
    await asyncio.sleep(0.4)

    released = await manager.release_idle()

    assert tree in released
    lease = await lease_of(sandbox, tree)
    assert (lease.state, lease.handle) == ("released", None)
    assert old_handle is not None and not await sandbox.backend.exists(old_handle)
    if sandbox.kind == "local":
        assert not any(_host_process_alive(pid) for pid in bg_pids)
    else:
        assert isinstance(sandbox.backend, DockerBackend) and sandbox.backend.containers_for(tree) == []
    after = await _run(manager, tree, workdir, 'cat kept.txt; test -e "$CANOPY_TMP/marker" || echo no-marker')
    assert after.stdout == "kept\nno-marker\n"
    assert (workdir / "kept.txt").read_text() == "kept\n"


async def test_release_idle_honours_the_idle_window(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()  # the default 300 s, judged at a given "now" instead of waited out
    tree, workdir = await sandbox.new_tree()
    await _run(manager, tree, workdir, "true")
    used_at = (await lease_of(sandbox, tree)).last_used_at

    assert await manager.release_idle(now=used_at + datetime.timedelta(seconds=299)) == []
    assert (await lease_of(sandbox, tree)).state == "active"
    assert await manager.release_idle(now=used_at + datetime.timedelta(seconds=301)) == [tree]
    assert (await lease_of(sandbox, tree)).state == "released"


async def test_release_idle_skips_a_tree_with_a_running_run(sandbox: SandboxKit) -> None:
    manager = sandbox.manager(idle_seconds=0.1)
    tree, workdir = await sandbox.new_tree()
    await _run(manager, tree, workdir, 'echo t > "$CANOPY_TMP/marker"')
    run_id = await insert_running_run(sandbox, tree)
    await asyncio.sleep(0.3)

    assert tree not in await manager.release_idle()
    assert (await lease_of(sandbox, tree)).state == "active"
    kept = await _run(manager, tree, workdir, 'cat "$CANOPY_TMP/marker"')
    assert kept.stdout == "t\n"

    async with sandbox.db.tx() as conn:
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now() WHERE run_id = %s", (run_id,)
        )
    await asyncio.sleep(0.3)
    assert tree in await manager.release_idle()
    assert (await lease_of(sandbox, tree)).state == "released"


async def test_release_in_flight_defers_a_claim_but_not_other_writes(sandbox: SandboxKit) -> None:
    gated = GatedBackend(sandbox.backend, "release")
    assert isinstance(gated, SandboxBackend)
    sweeper = SandboxManager(sandbox.db, gated, 0.1, sandbox.options)
    claimer = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await _run(claimer, tree, workdir, 'echo t > "$CANOPY_TMP/marker"')
    await asyncio.sleep(0.3)

    sweep = asyncio.create_task(sweeper.release_idle())
    await asyncio.wait_for(gated.entered.wait(), 10)
    await asyncio.sleep(0.5)  # a transaction held across release would be this old by now
    # The container removal runs with no transaction open and the lease row unlocked.
    assert await open_transactions(sandbox.db) == []
    assert (await lease_of(sandbox, tree)).state == "releasing"
    claimed_at: list[float] = []

    async def claim() -> str:
        handle = await claimer.claim(tree, workdir)
        claimed_at.append(time.monotonic())
        return handle

    claim_task = asyncio.create_task(claim())
    await asyncio.sleep(0.5)
    assert not claim_task.done(), "a claim must wait for the release in flight"
    assert await open_transactions(sandbox.db) == []  # waiting, it holds no transaction either

    # A write to the same tree's other rows commits meanwhile (only the lease row is locked).
    async with asyncio.timeout(5), sandbox.db.tx() as conn:
        await conn.execute("UPDATE trees SET stopped = true, stopped_at = now() WHERE tree_id = %s", (tree,))
    async with sandbox.db.tx() as conn:
        cur = await conn.execute("SELECT stopped FROM trees WHERE tree_id = %s", (tree,))
        assert await cur.fetchone() == {"stopped": True}
    assert not claim_task.done()

    gated.gate.set()
    assert await asyncio.wait_for(sweep, 30) == [tree]
    handle = await asyncio.wait_for(claim_task, 30)

    assert gated.finished_at is not None and claimed_at[0] >= gated.finished_at
    lease = await lease_of(sandbox, tree)
    assert (lease.state, lease.handle) == ("active", handle)
    fresh = await _run(claimer, tree, workdir, 'test -e "$CANOPY_TMP/marker" && echo old || echo fresh')
    assert fresh.stdout == "fresh\n"


async def test_a_restarted_runtime_adopts_the_existing_sandbox(sandbox: SandboxKit) -> None:
    tree, workdir = await sandbox.new_tree()
    first = sandbox.manager()
    handle = await first.claim(tree, workdir)
    await _run(first, tree, workdir, 'echo t > "$CANOPY_TMP/marker"')

    restarted = SandboxManager(sandbox.db, sandbox.new_backend(), 300, sandbox.options)
    readopted = await restarted.claim(tree, workdir)
    marker = await _run(restarted, tree, workdir, 'cat "$CANOPY_TMP/marker"')

    # A crash between creating the sandbox and committing its lease: the backend still finds it.
    async with sandbox.db.tx() as conn:
        await conn.execute("DELETE FROM sandbox_leases WHERE tree_id = %s", (tree,))
    after_crash = await SandboxManager(sandbox.db, sandbox.new_backend(), 300, sandbox.options).claim(
        tree, workdir
    )

    assert readopted == handle == after_crash
    assert marker.stdout == "t\n"
    if sandbox.kind == "docker":
        assert isinstance(sandbox.backend, DockerBackend)
        assert sandbox.backend.containers_for(tree) == [handle]
        assert _docker_ps_count(tree) == 1


def _docker_ps_count(tree: uuid.UUID) -> int:
    """``docker ps -a --filter label=canopy.tree_id=<tree>``, counted (the CLI, as an operator sees it)."""
    listed = subprocess.run(
        ["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"label=canopy.tree_id={tree}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    named = subprocess.run(
        ["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"name=^{container_name(tree)}$"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert listed == named
    return len(listed)


async def test_concurrent_claims_make_one_sandbox(sandbox: SandboxKit) -> None:
    tree, workdir = await sandbox.new_tree()
    managers = [SandboxManager(sandbox.db, sandbox.new_backend(), 300, sandbox.options) for _ in range(4)]

    handles = await asyncio.gather(*(manager.claim(tree, workdir) for manager in managers))

    assert len(set(handles)) == 1
    if sandbox.kind == "docker":
        assert _docker_ps_count(tree) == 1


async def test_a_vanished_sandbox_is_rebuilt_on_next_command(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await _run(manager, tree, workdir, "echo kept > kept.txt")
    old_handle = (await lease_of(sandbox, tree)).handle
    assert old_handle is not None
    await sandbox.backend.release(old_handle)  # behind the manager's back (docker rm -f, reboot)

    result = await _run(manager, tree, workdir, "cat kept.txt")

    assert result.stdout == "kept\n"
    lease = await lease_of(sandbox, tree)
    assert lease.state == "active" and lease.handle is not None and await sandbox.backend.exists(lease.handle)


async def test_an_orphan_of_a_tree_whose_sandbox_is_elsewhere_goes_alone(sandbox: SandboxKit) -> None:
    """This engine still has a tree's sandbox while the tree's lease names another, live one (on
    another node's engine, after the lease moved there): the reaper took the lease over to release
    this one, leaving the live one unnamed (its commands unstoppable, the tree's next command
    making a third). This one goes alone; the lease stays as it was."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    here = await manager.claim(tree, workdir)
    async with sandbox.db.tx() as conn:
        await conn.execute("UPDATE sandbox_leases SET handle = 'on-another-node', node_id = 'another-node' "
                           "WHERE tree_id = %s", (tree,))
    assert here in await manager.reap_orphans()
    assert not await sandbox.backend.exists(here)
    lease = await lease_of(sandbox, tree)
    assert (lease.state, lease.handle, lease.node_id) == ("active", "on-another-node", "another-node")


async def test_orphan_sandboxes_are_reaped_and_nothing_else(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    claimed_tree, claimed_workdir = await sandbox.new_tree()
    kept = await manager.claim(claimed_tree, claimed_workdir)
    # A claim that died between creating its sandbox and committing the lease.
    orphan_tree, orphan_workdir = await sandbox.new_tree()
    orphan = await sandbox.backend.ensure(orphan_tree, orphan_workdir, sandbox.options)
    (orphan_workdir / "kept.txt").write_text("workdir files survive")
    # Another deployment's sandbox on the same engine: its tree is not in this database.
    foreign_tree = uuid.uuid4()
    foreign = await sandbox.backend.ensure(foreign_tree, sandbox.root / "foreign", sandbox.options)
    try:
        reaped = await manager.reap_orphans()
        again = await manager.reap_orphans()

        assert orphan in reaped and kept not in reaped and foreign not in reaped
        assert orphan not in again and kept not in again
        assert not await sandbox.backend.exists(orphan)
        assert await sandbox.backend.exists(kept) and await sandbox.backend.exists(foreign)
        assert (orphan_workdir / "kept.txt").read_text() == "workdir files survive"
        lease = await lease_of(sandbox, claimed_tree)
        assert (lease.state, lease.handle) == ("active", kept)
        async with sandbox.db.tx() as conn:
            assert await leases.get(conn, foreign_tree) is None  # judged without writing a row
        if sandbox.kind == "docker":
            assert _docker_ps_count(orphan_tree) == 0 and _docker_ps_count(claimed_tree) == 1
    finally:
        await sandbox.backend.release(foreign)


async def test_a_stopped_container_is_restarted_with_a_fresh_tmp(sandbox: SandboxKit) -> None:
    if sandbox.kind == "local":
        pytest.skip("only a container can be stopped and started again")
    assert isinstance(sandbox.backend, DockerBackend)
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await _run(manager, tree, workdir, 'echo t > "$CANOPY_TMP/marker"')
    handle = (await lease_of(sandbox, tree)).handle
    assert handle is not None
    await asyncio.to_thread(sandbox.backend.client.containers.get(handle).stop, timeout=1)  # engine restart
    assert not await sandbox.backend.exists(handle)

    result = await _run(manager, tree, workdir, 'test -e "$CANOPY_TMP/marker" && echo kept || echo fresh')

    assert result.stdout == "fresh\n"  # /tmp is a tmpfs: it goes with the container's processes
    assert (await lease_of(sandbox, tree)).handle == handle
    assert sandbox.backend.containers_for(tree) == [handle]


async def test_network_is_off_unless_allowed(sandbox: SandboxKit) -> None:
    if sandbox.kind == "local":
        pytest.skip("the local backend does not isolate the network (documented)")
    assert isinstance(sandbox.backend, DockerBackend)
    tree, workdir = await sandbox.new_tree()
    handle = await sandbox.manager().claim(tree, workdir)
    container = sandbox.backend.client.containers.get(handle)
    host_config = container.attrs["HostConfig"]

    assert host_config["NetworkMode"] == "none"
    assert host_config["Memory"] == 256 * 1024 * 1024 and host_config["PidsLimit"] == 256
    assert container.labels["canopy.tree_id"] == str(tree)
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in container.attrs["Mounts"]}
    assert mounts == {"/workspace": (str(workdir), True), TOMBSTONES: (str(tombstones_dir(tree)), False)}
    open_tree, open_workdir = await sandbox.new_tree()
    networked = SandboxManager(sandbox.db, sandbox.backend, 300, dataclasses.replace(sandbox.options, network="host"))
    open_handle = await networked.claim(open_tree, open_workdir)
    assert sandbox.backend.client.containers.get(open_handle).attrs["HostConfig"]["NetworkMode"] == "host"


async def test_commands_run_as_the_configured_user(sandbox: SandboxKit) -> None:
    if sandbox.kind == "local":
        pytest.skip("the local backend runs commands as the runtime's own user (documented)")
    tree, workdir = await sandbox.new_tree()
    workdir.chmod(0o777)
    options = dataclasses.replace(sandbox.options, user="65534:65534")
    manager = SandboxManager(sandbox.db, sandbox.backend, 300, options)

    result = await _run(
        manager, tree, workdir, 'id -u; echo x > owned.txt; echo t > "$CANOPY_TMP/t"; echo $HOME'
    )

    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["65534", "/tmp"]
    assert (workdir / "owned.txt").stat().st_uid == 65534


@pytest.mark.parametrize("gone", ["released", "never-existed"])
async def test_run_on_a_dead_handle_raises_sandbox_gone(sandbox: SandboxKit, gone: str) -> None:
    tree, workdir = await sandbox.new_tree()
    if gone == "released":
        handle = await sandbox.backend.ensure(tree, workdir, sandbox.options)
        await sandbox.backend.release(handle)
        await sandbox.backend.release(handle)  # idempotent
    else:
        handle = str(sandbox.root / "no-such-sandbox") if sandbox.kind == "local" else "f" * 64

    assert not await sandbox.backend.exists(handle)
    with pytest.raises(SandboxGone):
        await sandbox.backend.run(handle, "echo never", 30, "never")


def _processes(kit: SandboxKit, tree: uuid.UUID, needle: str) -> list[str]:
    """Command lines starting with ``needle`` of the tree's sandbox processes: ``docker top`` of its
    container, or every process of the host (read from /proc) for the local backend."""
    if isinstance(kit.backend, DockerBackend):
        found = []
        for container_id in kit.backend.containers_for(tree):
            top = kit.backend.client.containers.get(container_id).top()
            found += [row[-1] for row in top["Processes"]]
    else:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
            except (OSError, NotADirectoryError):
                continue
    return [line for line in found if line.startswith(needle)]


async def _none_left(kit: SandboxKit, tree: uuid.UUID, tag: str) -> list[str]:
    """Processes that mention ``tag`` anywhere (the sleepers and the shells that started them),
    given a moment to be reaped after a kill."""
    for _ in range(40):
        left = [line for line in _processes(kit, tree, "") if tag in line]
        if not left:
            return []
        await asyncio.sleep(0.05)
    return left


def _sleeper(tag: str) -> str:
    """A command whose processes are findable by ``tag``: one child in its group, one that left it
    (setsid), and a mark file once both run."""
    return (
        f"sleep 3{tag}1 & setsid sleep 3{tag}2 >/dev/null 2>&1 & "
        "sleep 0.2; echo started > started.txt; wait"
    )


async def _until_exists(path: Path) -> None:
    for _ in range(200):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


async def test_kill_command_from_a_fresh_manager_kills_that_command_only(sandbox: SandboxKit) -> None:
    starter = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    tag = f"{random.randrange(10_000, 99_999)}"
    task = asyncio.create_task(starter.run_command(tree, workdir, _sleeper(tag), 60, command_id="cmd-1"))
    neighbour = asyncio.create_task(starter.run_command(tree, workdir, f"sleep 4{tag}; echo done", 60))
    await _until_exists(workdir / "started.txt")
    assert len(_processes(sandbox, tree, f"sleep 3{tag}")) == 2

    other_process = SandboxManager(sandbox.db, sandbox.new_backend(), 300, sandbox.options)
    killed = await other_process.kill_command(tree, "cmd-1")
    result = await asyncio.wait_for(task, 10)

    assert killed is True
    assert result.exit_code == 137 and not result.timed_out
    assert await _none_left(sandbox, tree, f"sleep 3{tag}") == []  # its group, and the child that left it
    assert len(_processes(sandbox, tree, f"sleep 4{tag}")) == 1 and not neighbour.done()
    # Finished or never known: nothing to kill, and nothing left behind by asking.
    assert await other_process.kill_command(tree, "cmd-1") is False
    assert await other_process.kill_command(tree, "no-such-command") is False
    assert len(_processes(sandbox, tree, f"sleep 4{tag}")) == 1 and not neighbour.done()
    if sandbox.kind == "docker":
        marks = await _run(starter, tree, workdir, "ls -A /tmp/.canopy | grep -v '[.]pid$' || true")
        tombstones = await _run(starter, tree, workdir, f"ls -A {TOMBSTONES}")
        # A tombstone of each id killed (a late start of it must not run), and no other mark.
        assert marks.stdout.split() == ["cmd-1.killed", "no-such-command.killed"]  # in /tmp, and on the host
        assert tombstones.stdout.split() == ["cmd-1.killed", "no-such-command.killed"]
    neighbour.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await neighbour


async def test_a_command_killed_before_it_started_never_runs(sandbox: SandboxKit) -> None:
    """Recovery kills the command of a Run that lost its lease; that Run may still be on its way to
    starting it (claiming the sandbox, creating the exec or process). The kill found nothing to kill
    and left nothing behind, so the command started afterwards and ran in full, while the model was
    told it was stopped. A kill, from any process, leaves a tombstone: the command, started later,
    exits as killed at once."""
    tree, workdir = await sandbox.new_tree()
    handle = await sandbox.backend.ensure(tree, workdir, sandbox.options)
    command_id = f"late-{uuid.uuid4().hex}"

    # Another process's backend: the tombstone must outlive the object that left it.
    assert await sandbox.new_backend().kill(handle, command_id) is False  # nothing ran yet: nothing to kill
    result = await sandbox.backend.run(handle, "echo ran > late.txt; echo ran", 30, command_id)

    again = await sandbox.backend.run(handle, "echo ran > late.txt; echo ran", 30, command_id)  # it stays

    assert (result.exit_code, result.stdout, result.timed_out) == (137, "", False), result
    assert (again.exit_code, again.stdout, again.timed_out) == (137, "", False), again
    await asyncio.sleep(0.5)
    assert not (workdir / "late.txt").exists()
    # Another command id is not refused.
    other = await sandbox.backend.run(handle, "echo ran > other.txt", 30, f"other-{uuid.uuid4().hex}")
    assert other.exit_code == 0 and (workdir / "other.txt").read_text() == "ran\n"


async def test_a_command_cancelled_while_its_sandbox_is_made_leaves_it_made(sandbox: SandboxKit) -> None:
    """A command cancelled during its claim cut the claim's round wherever it was: between committing
    ``creating`` and building (a CI run hit it), the lease stayed ``creating`` and every command of
    the tree waited two minutes for it to go stale. The round now runs to its end, and the next
    command finds the sandbox made."""
    backend = GatedBackend(sandbox.backend, "ensure")
    manager = SandboxManager(sandbox.db, backend, 300, sandbox.options)
    tree, workdir = await sandbox.new_tree()
    started = asyncio.create_task(manager.run_command(tree, workdir, "echo ran > cancelled.txt", 30, "cancelled-1"))
    await asyncio.wait_for(backend.entered.wait(), 60)
    started.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started
    assert (await lease_of(sandbox, tree)).state == "creating"  # its round goes on
    backend.gate.set()

    result = await asyncio.wait_for(manager.run_command(tree, workdir, "echo next", 30, "next-1"), 30)
    assert (result.exit_code, result.stdout) == (0, "next\n"), result
    assert backend.calls["ensure"] == 1  # the sandbox the cancelled command's round made
    assert not (workdir / "cancelled.txt").exists()


@pytest.mark.parametrize("gated", ["ensure", "release"])
async def test_a_command_killed_while_its_sandbox_comes_or_goes_never_runs(sandbox: SandboxKit, gated: str) -> None:
    """The kill of a command on its way to starting, while its tree's sandbox was being made (a
    first command: an image pull can take a minute) or released, found no sandbox to leave its
    tombstone in: the command ran once the sandbox was there, after its Run was told it stopped."""
    backend = GatedBackend(sandbox.backend, gated)
    starter = SandboxManager(sandbox.db, backend, 0.1, sandbox.options)
    tree, workdir = await sandbox.new_tree()
    if gated == "release":
        await _run(starter, tree, workdir, "true")
        await asyncio.sleep(0.3)
        releasing = asyncio.create_task(starter.release_idle())
        await asyncio.wait_for(backend.entered.wait(), 10)
    command_id = f"late-{uuid.uuid4().hex}"
    started = asyncio.create_task(starter.run_command(tree, workdir, "echo ran > late.txt; echo ran", 30, command_id))
    if gated == "ensure":
        await asyncio.wait_for(backend.entered.wait(), 60)
    else:
        await asyncio.sleep(0.3)  # its claim waits for the release
    assert (await lease_of(sandbox, tree)).state == ("creating" if gated == "ensure" else "releasing")

    await sandbox.manager().kill_command(tree, command_id)  # from another process, as recovery does
    backend.gate.set()
    result = await asyncio.wait_for(started, 120)
    if gated == "release":
        await releasing

    assert (result.exit_code, result.stdout, result.timed_out) == (137, "", False), result
    await asyncio.sleep(0.5)
    assert not (workdir / "late.txt").exists()
    assert (await lease_of(sandbox, tree)).state == "active"  # the sandbox is there for the next one
    other = await starter.run_command(tree, workdir, "echo ran > other.txt", 30, f"other-{uuid.uuid4().hex}")
    assert other.exit_code == 0 and (workdir / "other.txt").read_text() == "ran\n"


@pytest.mark.parametrize("delay", [-0.01, 0.0, 0.01, 0.05, 0.2])
async def test_a_kill_racing_the_start_of_its_command_leaves_nothing_running(
        sandbox: SandboxKit, delay: float) -> None:
    """Whichever comes first, the start or the kill (from another process), the command ends killed.
    A negative delay starts the kill that long before the command."""
    tree, workdir = await sandbox.new_tree()
    handle = await sandbox.backend.ensure(tree, workdir, sandbox.options)
    command_id = f"race-{uuid.uuid4().hex}"
    killer = sandbox.new_backend()

    async def kill() -> None:
        await asyncio.sleep(max(delay, 0))
        await killer.kill(handle, command_id)

    async def start() -> CommandResult:
        await asyncio.sleep(max(-delay, 0))
        return await sandbox.backend.run(handle, _PID_THEN_SLEEP.format(name="raced"), 60, command_id)

    result, _ = await asyncio.wait_for(asyncio.gather(start(), kill()), 10)

    assert (result.exit_code, result.timed_out) == (137, False), result
    pid_state = _PID_STATE.format(file="$CANOPY_TMP/raced.pid")
    check = f'if [ -e "$CANOPY_TMP/raced.pid" ]; then {pid_state}; else echo never-started; fi'
    state = await sandbox.backend.run(handle, check, 30, f"check-{uuid.uuid4().hex}")
    assert state.stdout.strip() in {"dead", "never-started"}


async def test_kill_command_without_a_sandbox_is_false_and_makes_none(sandbox: SandboxKit) -> None:
    tree, _ = await sandbox.new_tree()

    assert await sandbox.manager().kill_command(tree, "cmd-1") is False

    async with sandbox.db.tx() as conn:
        assert await leases.get(conn, tree) is None
        assert await leases.was_killed(conn, tree, "cmd-1")  # a start of it still on its way never runs


async def test_kill_command_after_the_starting_process_died(sandbox: SandboxKit) -> None:
    """kill -9 of the process that started a command leaves the command running; another
    process's kill_command then stops it."""
    tree, workdir = await sandbox.new_tree()
    tag = f"{random.randrange(10_000, 99_999)}"
    state_root = sandbox.backend.state_root if isinstance(sandbox.backend, LocalBackend) else Path("-")
    starter = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.sandbox.start_command", sandbox.kind, sandbox.db.pool.conninfo,
        str(state_root), str(tree), str(workdir), "cmd-9", _sleeper(tag),
        cwd=Path(__file__).parents[2],
    )
    try:
        await _until_exists(workdir / "started.txt")
    finally:
        os.kill(starter.pid, signal.SIGKILL)
        await starter.wait()
    await asyncio.sleep(0.3)
    assert len(_processes(sandbox, tree, f"sleep 3{tag}")) == 2  # the command outlived its starter

    assert await sandbox.manager(backend=sandbox.new_backend()).kill_command(tree, "cmd-9") is True

    assert await _none_left(sandbox, tree, f"sleep 3{tag}") == []
    assert await sandbox.manager().kill_command(tree, "cmd-9") is False


async def test_host_and_sandbox_edit_each_others_files(sandbox: SandboxKit) -> None:
    """write_file runs on the host (as root in CI), commands in the sandbox (never as root): each
    side can still edit what the other made."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await manager.claim(tree, workdir)

    write_file(workdir, "from-host/notes.txt", "host\n")
    edited = await _run(manager, tree, workdir, "echo sandbox >> from-host/notes.txt && touch from-host/new")
    made = await _run(manager, tree, workdir, "mkdir -p from-sandbox && echo sandbox > from-sandbox/out.txt")
    write_file(workdir, "from-sandbox/out.txt", "host again\n")
    again = await _run(manager, tree, workdir, "cat from-sandbox/out.txt && echo more >> from-sandbox/out.txt")

    assert (edited.exit_code, made.exit_code, again.exit_code) == (0, 0, 0), (edited, made, again)
    assert read_file(workdir, "from-host/notes.txt") == "host\nsandbox\n"
    assert again.stdout == "host again\n"
    assert read_file(workdir, "from-sandbox/out.txt") == "host again\nmore\n"


async def test_commands_see_no_secret_of_the_runtime_environment(
    sandbox: SandboxKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    for name in ("CANOPY_DATABASE_URL", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "CANOPY_ADMIN_TOKEN"):
        monkeypatch.setenv(name, secret)
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()

    result = await _run(manager, tree, workdir, "env; cat /proc/self/environ")

    assert result.exit_code == 0
    assert secret not in result.stdout
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert {"CANOPY_TMP", "CANOPY_TREE_ID", "CANOPY_COMMAND_ID"} <= names
