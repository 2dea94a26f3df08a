"""A tree's sandbox on the node of its lease (actors/sandbox_hosts.py), reached from every node; a lost
node's workdir is reported, never silently replaced. The cluster: see sandbox_hosts_scenario.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray

from actors import sandbox_hosts, sandbox_tools
from actors.naming import sandbox_host_name
from actors.runtime import Runtime
from actors.sandbox_hosts import WORKDIR_LOST
from actors.sandbox_tools import HOST_LOST_STOPPED, command_id
from actors.scripted import call, create, say, script
from actors.sweeper import restart_silent
from persistence import sandbox_leases as leases
from persistence.errors import DatabaseUnreachable
from persistence.records import RunRef, Scope, new_id
from persistence.settings import get_settings
from sandbox import workdirs
from sandbox.base import SandboxFull, SandboxMoved
from sandbox.manager import choose_backend
from tests.actors.gateways_scenario import PINNED_ENV
from tests.actors.helpers import BEATING, alive_sandbox_hosts, assert_stopped, eventually, rows, scenario_findings
from tests.conftest import RUNTIME_ENV
from tests.hostile.helpers import workdir_of


async def beating(runtime: Runtime, scope: Scope, *then: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """A new tree whose Turn runs the BEATING command, then ``then``; and its workdir, once the
    command runs."""
    created = await runtime.create_root(scope, input_text=script(
        call(("run_command", {"command": BEATING, "timeout_seconds": 60})), *then))
    workdir = await workdir_of(runtime, created["session"]["session_id"])
    await eventually(lambda: asyncio.to_thread((workdir / "running.txt").exists), timeout=60)
    return created, workdir


async def lease_of_an_earlier_life(runtime: Runtime, tree_id: uuid.UUID) -> str:
    """Ray started again: the tree's lease names a node of the cluster's earlier life at this
    machine's address (the sweeper recorded it). This node's id."""
    here = ray.get_runtime_context().get_node_id()
    address = next(node["NodeManagerAddress"] for node in ray.nodes() if node["NodeID"] == here)
    earlier = uuid.uuid4().hex + uuid.uuid4().hex[:24]  # a node id no other test's lease names
    async with runtime.db.tx() as conn:  # at once: the sweeper forgets a node no lease names
        await conn.execute("INSERT INTO ray_nodes (node_id, address) VALUES (%s, %s)", (earlier, address))
        await conn.execute("UPDATE sandbox_leases SET node_id = %s WHERE tree_id = %s", (earlier, tree_id))
    return here


@pytest.mark.default_shape  # where the sandbox is, not where the session runs
async def test_the_sweeper_releases_an_idle_sandbox_in_its_nodes_host(runtime: Runtime, scope: Scope) -> None:
    """Commands run in the node's sandbox host, and the sweeper's idle release goes through it
    (CANOPY_SANDBOX_IDLE_SECONDS is 20 in the tests' runtime)."""
    node_id = ray.get_runtime_context().get_node_id()
    created = await runtime.create_root(scope, input_text=script(
        call(("run_command", {"command": "echo hi"})), call(("read_file", {"path": "missing.txt"})),
        say("${0.stdout}|${1.error}")))
    tree_id = created["session"]["session_id"]
    output = (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"]
    # The host's error reaches the model as its own sentence, not Ray's wrapper and traceback.
    assert output.startswith("hi\n|") and "missing.txt" in output, output
    assert "Ray" not in output and "Traceback" not in output, output
    query = "SELECT state, handle, node_id FROM sandbox_leases WHERE tree_id = %s"
    [lease] = await rows(runtime.db, query, tree_id)
    assert (lease["state"], lease["node_id"]) == ("active", node_id)
    hosts = await alive_sandbox_hosts()
    assert [host.node_id for host in hosts] == [node_id]

    async def released() -> Any:
        found = await rows(runtime.db, query, tree_id)
        return found if found[0]["state"] == "released" else None

    assert await eventually(released, timeout=90) == [{"state": "released", "handle": None, "node_id": node_id}]
    assert not await choose_backend().exists(lease["handle"])


@pytest.mark.default_shape  # the sandbox host dies, not the session's process
@pytest.mark.parametrize("how", ["killed", "answering nothing"])
async def test_a_command_whose_host_died_is_stopped(runtime: Runtime, scope: Scope, how: str) -> None:
    """A ``docker exec`` outlives the host that started it, and its timeout died with the host: the
    command must be killed through the host's successor, not left running (the model, told its
    outcome is unknown, may well run it again beside it). A host stopped or stuck (its event loop
    blocked) answered nothing and held its callers' Turns, whose leases their own processes renew,
    without end: the sweeper's check kills it, for Ray to start it again, and the rest is the same."""
    created, workdir = await beating(runtime, scope, say("after"))
    tree_id = created["session"]["session_id"]
    [host] = await alive_sandbox_hosts()
    if how == "killed":
        os.kill(int(host.pid), signal.SIGKILL)
    else:
        name = sandbox_host_name(ray.get_runtime_context().get_node_id())
        assert await restart_silent([name], timeout=5) == []  # it answers: kept
        os.kill(int(host.pid), signal.SIGSTOP)
        try:
            assert await restart_silent([name], timeout=2) == [name]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(host.pid), signal.SIGCONT)

    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "after"), result
    await assert_stopped(workdir)
    [told] = await rows(runtime.db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'tool'",
                        tree_id)
    assert json.loads(told["content"]) == {"outcome": "unknown", "error": HOST_LOST_STOPPED}, told
    receipts = await rows(runtime.db, "SELECT r.state FROM tool_receipts r JOIN turns t USING (turn_id) "
                          "WHERE t.session_id = %s", tree_id)
    assert receipts == [{"state": "done"}]
    [again] = await alive_sandbox_hosts()
    assert again.pid != host.pid and not psutil.pid_exists(int(host.pid))


@pytest.mark.default_shape  # where the sandbox is, not where the session runs
async def test_a_sandbox_of_an_earlier_life_of_ray_is_this_machines_and_its_command_is_stopped(
        runtime: Runtime, scope: Scope) -> None:
    """Ray gives every node a new id each time it starts (``canopy up`` after a crash): the tree's
    lease then names a node no live Ray knows. That was taken for a lost node: a command still
    running in the sandbox was not stopped (there was no host to ask), and every member was told its
    files were gone, though the workdir is on this machine's disk as it was. The lease follows the
    machine (the address the old node had, as the sweeper recorded it)."""
    created, workdir = await beating(runtime, scope, call(("read_file", {"path": "running.txt"})),
                                     say("${1.content}"))
    tree_id = created["session"]["session_id"]
    # Ray started again: the host that ran the command is gone, and the lease names a node of the
    # earlier life at this machine's address.
    here = await lease_of_an_earlier_life(runtime, tree_id)
    [lease] = await rows(runtime.db, "SELECT handle FROM sandbox_leases WHERE tree_id = %s", tree_id)
    hosts = await alive_sandbox_hosts()
    os.kill(int(hosts[0].pid), signal.SIGKILL)

    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "running\n"), result
    told = await rows(runtime.db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'tool' "
                      "ORDER BY id", tree_id)
    assert [("workdir_lost" in json.loads(row["content"])) for row in told] == [False, False], told
    await assert_stopped(workdir)  # through this machine's new host
    [after] = await rows(runtime.db, "SELECT node_id, handle, state, workdir_lost_at FROM sandbox_leases "
                         "WHERE tree_id = %s", tree_id)
    assert after == {"node_id": here, "handle": lease["handle"], "state": "active", "workdir_lost_at": None}


@pytest.mark.default_shape  # where the sandbox is, not where the session runs
async def test_a_kill_whose_lease_another_caller_adopts_meanwhile_still_stops_the_command(
        runtime: Runtime, scope: Scope) -> None:
    """A kill that read a lease naming a node of an earlier life, while another caller (the sweeper,
    another member's call) moved that lease to this machine's node, found nothing left to adopt and
    answered that the command had not run: the command ran on with nothing to stop it, and its Run
    told the model it was stopped."""
    created, workdir = await beating(runtime, scope, say("after"))
    tree_id = created["session"]["session_id"]
    [started] = await rows(runtime.db, "SELECT r.turn_id, r.tool_call_id FROM tool_receipts r JOIN turns t "
                           "USING (turn_id) WHERE t.session_id = %s", tree_id)
    here = await lease_of_an_earlier_life(runtime, tree_id)
    async with runtime.db.tx() as conn:  # the other caller's adoption, committed once the kill waits on it
        await conn.execute("UPDATE sandbox_leases SET node_id = %s WHERE tree_id = %s", (here, tree_id))
        locker = (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"]
        kill = asyncio.create_task(sandbox_hosts.kill_command(
            runtime.db, tree_id, command_id(started["turn_id"], started["tool_call_id"])))
        waiting = ("SELECT 1 FROM pg_stat_activity WHERE application_name = %s "  # the kill's, not the sweeper's
                   "AND %s = ANY(pg_blocking_pids(pid))")
        await eventually(lambda: rows(runtime.db, waiting, f"canopy-{os.getpid()}", locker), timeout=30)
    assert await kill is True
    await assert_stopped(workdir)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "after"), result


@pytest.mark.default_shape  # the sandbox host dies, not the session's process
async def test_a_read_or_write_that_finds_the_sandbox_host_restarting_is_asked_of_its_successor(
        runtime: Runtime, scope: Scope) -> None:
    """A read changes nothing, and a write's host answers a repeat from the receipt it committed with
    the write: neither has an outcome to be unsure of. One that reaches the tree's host while Ray
    restarts it (it crashed, or a command took it down) is asked of its successor; it used to come
    back as "whether the call took effect is unknown"."""
    created = await runtime.create_root(scope, input_text=script(
        call(("write_file", {"path": "kept.txt", "content": "kept"})), say("written")))
    session_id = created["session"]["session_id"]
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "written"
    hosts = await alive_sandbox_hosts()
    os.kill(int(hosts[0].pid), signal.SIGKILL)
    sent = await runtime.submit_input(scope, session_id, script(
        call(("write_file", {"path": "new.txt", "content": "new"})), call(("read_file", {"path": "kept.txt"})),
        say("${0.bytes}|${1.content}")))
    result = await runtime.wait_result(scope, sent["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "3|kept"), result
    workdir = await workdir_of(runtime, session_id)
    assert await asyncio.to_thread((workdir / "new.txt").read_text) == "new"


@ray.remote
class _Unanswering:
    """A sandbox host that does not answer (its engine hung on a read, a write or a kill), before its
    process is killed and after Ray restarted it."""

    async def pid(self) -> int:
        return os.getpid()

    async def answer(self) -> None:
        await asyncio.sleep(300)


@pytest.mark.default_shape  # no session: the test process calls the actor
@pytest.mark.parametrize("loss", ["found by the call", "known before"])
async def test_a_call_whose_hosts_successor_does_not_answer_fails_after_the_successor_wait(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch, loss: str) -> None:
    """A read or write whose host died under it is asked again of the host's successor, and so is
    the kill of a command whose host died while it ran; a successor that answered nothing held the
    call, and its Turn, until the Turn was cancelled (the wait bounded only the asks that failed).
    Either fails with the host's loss once the successor wait is over (a command's Run then leaves
    the kill to its recovery)."""
    monkeypatch.setattr(sandbox_tools, "_SUCCESSOR_WAIT_SECONDS", 3.0)
    host = _Unanswering.options(max_restarts=1).remote()
    try:
        pid = await host.pid.remote()

        def ask() -> Any:
            return sandbox_hosts.call(host, "answer")

        if loss == "found by the call":
            call = asyncio.create_task(sandbox_tools._until_the_successor_answers(ask))
            await asyncio.sleep(0.5)  # the call is in flight
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
            call = asyncio.create_task(sandbox_tools._until_the_successor_answers(
                ask, sandbox_hosts.HostLost(sandbox_hosts.HOST_LOST)))
        with pytest.raises(sandbox_hosts.HostLost):
            await asyncio.wait_for(call, 60)
    finally:
        ray.kill(host)


async def test_a_trees_sandbox_is_reached_from_every_node_and_its_loss_is_told(own_database_url: str,
                                                                               tmp_path: Path) -> None:
    findings = await scenario_findings("tests.actors.sandbox_hosts_scenario", {
        **RUNTIME_ENV, "CANOPY_DATA_DIR": str(tmp_path), "SCENARIO_DATABASE_URL": own_database_url,
        "CANOPY_SANDBOX_BACKEND": "local", "CANOPY_SANDBOX_MAX_PER_SCOPE": "2",
        "CANOPY_SANDBOX_IDLE_SECONDS": "600", **PINNED_ENV}, timeout=240)
    head, other = findings["head"], findings["other"]
    assert head != other

    # The first command, from a session on the second node, made the tree's sandbox there.
    assert findings["first"] == {"exit_code": 0, "stdout": "started\n", "stderr": ""}, findings
    first = findings["first_lease"]
    assert (first["state"], first["node_id"], first["lost"]) == ("active", other, False), findings
    assert findings["hosts_after_first"].get(f"canopy:sandbox:{other}") == other, findings

    # The same session, now on the head, ran its next command in that sandbox: its private /tmp and
    # the workdir the first wrote (the head's own host would have refused a lease of another node).
    assert findings["session_node"] == [head], findings
    assert findings["second"] == {"exit_code": 0, "stdout": "first\nfrom-node-2\n", "stderr": ""}, findings
    assert findings["second_lease"] == first, findings

    # Another tree's first sandbox call, a file write from the second node, put its sandbox there: its
    # first command, from the head, ran in that node's sandbox (made there then), not in one of the
    # head's, where the file written would not be (each node has its own disk).
    assert findings["pinned_write"] == str(len("written on node 2")), findings
    assert findings["pinned_lease"] == {"state": "released", "handle": None, "node_id": other, "lost": False}, findings
    assert findings["pinned_run"] == {"exit_code": 0, "stdout": "written on node 2", "stderr": ""}, findings
    pinned = findings["pinned_run_lease"]
    assert (pinned["state"], pinned["node_id"]) == ("active", other), findings

    # The third tree of a user whose two sandboxes on the second node were idle got one on the head:
    # the second node's host released the older (least recently used) one for it, and kept the other.
    assert findings["limited_third"] == {"exit_code": 0, "stdout": "third\n", "stderr": ""}, findings
    older, newer, third = findings["limited_leases"]
    assert (older["state"], older["node_id"]) == ("released", other), findings
    assert (newer["state"], newer["node_id"]) == ("active", other), findings
    assert (third["state"], third["node_id"]) == ("active", head), findings

    # A call whose move of a lost node's lease lost the race went where the winner moved it, told of the loss.
    assert findings["raced"] == {"host": "other", "lost": True}, findings
    assert findings["raced_lease"] == {"state": "released", "handle": None, "node_id": other, "lost": True}, findings

    # The second node left, and the sweeper released the sandbox that went with it (a lease left
    # active would be counted, and never idle-released: no host of that node is left to ask). The
    # lease still names the lost node, and no command has been told yet: the next one is.
    assert findings["swept_lease"] == {"state": "released", "handle": None, "node_id": other, "lost": False}, findings

    # The second node left: the next command was told the workdir was lost, and ran in a new sandbox
    # on the head, from nothing (no marker, no note).
    third = findings["third"]
    assert third["workdir_lost"] is True and third["notice"] == WORKDIR_LOST, findings
    assert third["exit_code"] != 0 and "marker" in third["stderr"] and "note.txt" in third["stderr"], findings
    lease = findings["third_lease"]
    assert (lease["state"], lease["node_id"], lease["lost"]) == ("active", head, True), findings
    assert findings["hosts_after_loss"].get(f"canopy:sandbox:{head}") == head, findings
    assert f"canopy:sandbox:{other}" not in findings["hosts_after_loss"], findings
    # The receipt keeps what the model was told: a replay of that Turn answers the same.
    assert findings["receipts"][-1] == third, findings
    assert findings["workdir_exists"] is True


async def test_every_member_from_before_a_workdir_loss_is_told_once(runtime: Runtime, scope: Scope) -> None:
    """The call that finds the node gone moves the tree's sandbox; each other member of the tree made
    before the loss finds the workdir empty too, so its next sandbox call is told as well, once. A
    member made after the loss never knew the old workdir and is not told."""
    created = await runtime.create_root(scope, input_text=script(
        call(create("c", script(say("ready")))), call(("run_command", {"command": "echo before > note.txt"})),
        say("made")))
    tree_id = created["session"]["session_id"]
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "made"
    [child] = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND name = 'c'", tree_id)
    # The lease's node left the cluster and the sweeper released its sandbox (release_on_lost_nodes).
    gone = "ff" * 28
    await rows(runtime.db, "UPDATE sandbox_leases SET node_id = %s, state = 'released', handle = NULL "
               "WHERE tree_id = %s RETURNING tree_id", gone, tree_id)

    async def command(session_id: Any, text: str = "ls") -> None:
        submitted = await runtime.submit_input(scope, session_id, script(call(("run_command", {"command": text})),
                                                                       say("ran")), origin_kind="api")
        assert (await runtime.wait_result(scope, submitted["input_id"], timeout=60))["output"] == "ran"

    await command(child["session_id"])  # finds the node gone: moves the lease
    await command(tree_id)  # another member from before the loss
    await command(tree_id)  # told already
    await command(tree_id, "true")
    made_after = await runtime.submit_input(scope, tree_id, script(
        call(create("d", script(call(("run_command", {"command": "ls"})), say("ran")))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("${1.results.0.output}")), origin_kind="api")
    assert (await runtime.wait_result(scope, made_after["input_id"], timeout=60))["output"] == "ran"

    told = await rows(runtime.db, "SELECT s.name, m.content FROM thread_messages m JOIN sessions s USING (session_id) "
                      "WHERE s.tree_id = %s AND m.role = 'tool' AND m.content LIKE '%%exit_code%%' ORDER BY m.id",
                      tree_id)
    results = [(row["name"], json.loads(row["content"])) for row in told]
    lost = [(name, result.get("workdir_lost", False)) for name, result in results]
    assert lost == [("root", False), ("c", True), ("root", True), ("root", False), ("root", False), ("d", False)], lost
    assert [result["notice"] for _, result in results if "notice" in result] == [WORKDIR_LOST, WORKDIR_LOST]
    [lease] = await rows(runtime.db, "SELECT node_id, workdir_lost_at FROM sandbox_leases WHERE tree_id = %s", tree_id)
    assert lease["node_id"] == ray.get_runtime_context().get_node_id()
    marks = await rows(runtime.db, "SELECT s.name, t.lost_at FROM workdir_losses_told t JOIN sessions s "
                       "USING (session_id) WHERE s.tree_id = %s ORDER BY s.name", tree_id)
    assert marks == [{"name": "c", "lost_at": lease["workdir_lost_at"]},
                     {"name": "root", "lost_at": lease["workdir_lost_at"]}]


async def test_a_hosts_errors_reach_its_caller_as_themselves(runtime: Runtime) -> None:
    """An error whose class takes more than its sentence (a full engine's, how many sandboxes must go)
    crosses from the host's process to the caller's as itself; it came back as Ray's
    UnserializableException, which no sandbox tool handles."""

    @ray.remote(num_cpus=0)
    class Failing:
        def full(self) -> None:
            raise SandboxFull("the engine is full", 3)

        def unreachable(self) -> None:
            raise DatabaseUnreachable("postgresql://canopy:secret@db/canopy", "connection refused")

    host = Failing.remote()  # type: ignore[attr-defined]
    try:
        with pytest.raises(SandboxFull, match="the engine is full") as full:
            await sandbox_hosts.call(host, "full")
        assert full.value.needed == 3
        with pytest.raises(DatabaseUnreachable, match="connection refused") as unreachable:
            await sandbox_hosts.call(host, "unreachable")
        assert "secret" not in str(unreachable.value)
    finally:
        ray.kill(host)


async def test_a_hosts_commands_and_files_use_the_workdirs_disk(runtime: Runtime, scope: Scope,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a host reaches a workdir mounts its disk image first (sandbox/workdirs.py): a command
    that fills it fills 16 MiB, and a file read finds what the command wrote there. The runtime's own
    hosts have no quota (tests/conftest.py); this host is one of the test's, with the setting on."""
    if os.geteuid() != 0:
        pytest.skip("a workdir's disk is a loop mount, which needs root")
    created = await runtime.create_root(scope, input_text=script(say("made")))
    tree_id = created["session"]["session_id"]
    workdir = str(await workdir_of(runtime, tree_id))
    monkeypatch.setenv("CANOPY_SANDBOX_WORKDIR_MB", "16")
    get_settings.cache_clear()
    host = sandbox_hosts.SandboxHostImpl(ray.get_runtime_context().get_node_id())
    try:
        filled = await host.run_command(tree_id, workdir, "dd if=/dev/zero of=big bs=1M count=64 2>&1; "
                                        "echo rc=$? > rc.txt", 60, "quota-1")
        assert "No space left on device" in str(filled["stdout"]), filled
        assert await host.read_file(tree_id, workdir, "rc.txt") == {"path": "rc.txt", "content": "rc=1\n"}
        assert os.path.ismount(workdir) and workdirs.image_of(Path(workdir)).stat().st_blocks * 512 <= 16 * 2**20
    finally:
        get_settings.cache_clear()
        manager = await host._sandboxes()
        for lease in await rows(runtime.db, "SELECT handle FROM sandbox_leases WHERE tree_id = %s AND handle IS NOT "
                                "NULL", tree_id):
            await manager.backend.release(lease["handle"])  # its container binds the mount
        manager.close()
        await host._db.close()
        if os.path.ismount(workdir):
            await asyncio.to_thread(workdirs.unmount, Path(workdir))


async def test_a_host_refuses_a_tree_whose_sandbox_is_on_another_node_and_makes_nothing(
        runtime: Runtime, scope: Scope) -> None:
    """A call routed by an older lease (another member moved it meanwhile) reaches a host whose node
    no longer holds the tree's workdir: a workdir made there would be another, empty one, and a file
    written to it lost to the tree. The host refuses every entry point before touching the disk."""
    created = await runtime.create_root(scope, input_text=script(say("made")))
    tree_id = created["session"]["session_id"]
    workdir = str(await workdir_of(runtime, tree_id))
    elsewhere = "ee" * 28
    async with runtime.db.tx() as conn:
        await leases.pin_node(conn, tree_id, get_settings().sandbox_backend, elsewhere)
    before = await rows(runtime.db, "SELECT * FROM sandbox_leases WHERE tree_id = %s", tree_id)
    host = sandbox_hosts.SandboxHostImpl(ray.get_runtime_context().get_node_id())
    try:
        calls = [host.run_command(tree_id, workdir, "echo here > note.txt", 60, "moved-1"),
                 host.read_file(tree_id, workdir, "note.txt"),
                 host.write_file(workdir, "note.txt", "here", RunRef(scope, tree_id, tree_id, new_id(), new_id(),
                                                                     "a stale run"), "call-1",
                                 {"path": "note.txt", "sha256": hashlib.sha256(b"here").hexdigest()})]
        for attempt in calls:
            with pytest.raises(SandboxMoved, match=elsewhere):
                await attempt
    finally:
        if host._manager is not None:
            host._manager.close()
        await host._db.close()
    assert not Path(workdir).exists()
    assert await rows(runtime.db, "SELECT * FROM sandbox_leases WHERE tree_id = %s", tree_id) == before
