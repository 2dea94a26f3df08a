"""The sandbox tools through the whole runtime: shared workdir and /tmp, cancel, approvals, replay."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest

from actors import sandbox_hosts
from actors.runtime import Runtime
from actors.sandbox_tools import DENIED
from actors.scripted import call, create, say, script
from persistence import agents
from persistence.errors import LeaseLost
from persistence.records import RunRef, Scope
from tests.actors.helpers import eventually, kill_session_process, rows, session_id_at
from tests.hostile.helpers import workdir_of
from tests.persistence.helpers import start_root_run


async def test_members_share_workdir_and_tmp(runtime: Runtime, scope: Scope) -> None:
    reader = script(call(("read_file", {"path": "notes/hello.txt"}),
                         ("run_command", {"command": 'cat "$CANOPY_TMP/marker"'})),
                    say("$${0.content}|$${1.stdout}"))
    text = script(
        call(("write_file", {"path": "notes/hello.txt", "content": "from root"}),
             ("run_command", {"command": 'echo tmp-marker > "$CANOPY_TMP/marker"'})),
        call(create("worker", reader)),
        call(("wait_inputs", {"input_ids": ["${2.input_id}"]})),
        say("${3.results.0.output}"),
    )
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"] == "from root|tmp-marker\n"
    workdir = await workdir_of(runtime, created["session"]["session_id"])
    assert (workdir / "notes" / "hello.txt").read_text() == "from root"


async def test_path_escape_is_a_tool_error_and_writes_nothing(runtime: Runtime, scope: Scope) -> None:
    text = script(call(("write_file", {"path": "../escape.txt", "content": "x"})), say("${0.error}"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    workdir = await workdir_of(runtime, created["session"]["session_id"])
    assert ".." in result["output"]
    assert not (workdir.parent / "escape.txt").exists()


async def test_cancel_kills_only_that_turns_command(runtime: Runtime, scope: Scope) -> None:
    text = script(
        call(create("sleeper", script(call(("run_command", {"command": "sleep 30"})), say("woke"))),
             create("sibling", script(call(("run_command", {"command": "sleep 2; echo sibling-done"})),
                                      say("$${0.stdout}")))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
        say("${2.results.0.status} ${2.results.1.output}"),
    )
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    sleeper = await eventually(lambda: _session(runtime, tree_id, "/root/sleeper"))
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM thread_messages WHERE session_id = %s "
                                  "AND role = 'assistant'", sleeper))
    await asyncio.sleep(0.5)
    turn = (await rows(runtime.db, "SELECT turn_id FROM turns WHERE session_id = %s", sleeper))[0]["turn_id"]
    await runtime.cancel_turn(scope, sleeper, turn)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "cancelled sibling-done\n"


async def test_a_stale_runs_file_write_is_refused_where_it_would_be_written(runtime: Runtime, scope: Scope) -> None:
    # A Run that stalled past its lease between its write's receipt and the write, its Turn resumed
    # by another Run meanwhile, wrote over what that one had written since: the sandbox host wrote
    # whatever it was asked. It now writes under the asking Run's fence.
    created = await runtime.create_root(scope, input_text=script(
        call(("write_file", {"path": "plan.txt", "content": "newer"})), say("written")))
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "written"
    tree_id = created["session"]["session_id"]
    [run] = await rows(runtime.db, "SELECT run_id, turn_id, owner FROM runs WHERE session_id = %s", tree_id)
    stale = RunRef(scope, tree_id, tree_id, run["turn_id"], run["run_id"], run["owner"])
    host, _ = await sandbox_hosts.host_for(runtime.db, tree_id, tree_id)
    workdir = await workdir_of(runtime, tree_id)

    with pytest.raises(LeaseLost):
        await sandbox_hosts.call(host, "write_file", str(workdir), "plan.txt", "stale", stale, "call-9",
                                 {"path": "plan.txt", "sha256": hashlib.sha256(b"stale").hexdigest()})
    assert (workdir / "plan.txt").read_text() == "newer"


@pytest.mark.default_shape  # the sandbox host's write, not where the session runs
async def test_a_write_asked_again_after_its_caller_died_gets_its_receipt_and_writes_nothing(
        runtime: Runtime, scope: Scope) -> None:
    """A session that died after its host had written a file, before the call's receipt committed:
    the Run that took the Turn over found no receipt and wrote the old bytes again, over what another
    member had written there since. The receipt commits with the write, in the host."""
    tree, run = await start_root_run(runtime.db, scope)
    host, _ = await sandbox_hosts.host_for(runtime.db, tree.tree_id, tree.root_id)
    workdir = await workdir_of(runtime, tree.root_id)
    key = {"path": "plan.txt", "sha256": hashlib.sha256(b"mine").hexdigest()}
    first = await sandbox_hosts.call(host, "write_file", str(workdir), "plan.txt", "mine", run, "call-1", key)
    (workdir / "plan.txt").write_text("newer, by another member")
    again = await sandbox_hosts.call(host, "write_file", str(workdir), "plan.txt", "mine", run, "call-1", key)
    assert again == first == {"path": "plan.txt", "bytes": 4}
    assert (workdir / "plan.txt").read_text() == "newer, by another member"
    assert await rows(runtime.db, "SELECT tool_name, state FROM tool_receipts WHERE turn_id = %s",
                      run.turn_id) == [{"tool_name": "write_file", "state": "done"}]


async def _session(runtime: Runtime, tree_id: uuid.UUID, path: str) -> uuid.UUID | None:
    found = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = %s", tree_id, path)
    return found[0]["session_id"] if found else None


async def _asking_agent(runtime: Runtime, scope: Scope) -> str:
    async with runtime.db.tx() as conn:
        from persistence.scopes import ensure_scope

        await ensure_scope(conn, scope)
        await agents.create_agent(conn, scope, {"agent_id": "careful", "name": "Careful", "model": "canopy/scripted",
                                                "approval_mode": "ask"})
    return "careful"


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_approval_flow(runtime: Runtime, scope: Scope, decision: str) -> None:
    agent_id = await _asking_agent(runtime, scope)
    text = script(call(("run_command", {"command": "echo ran >> ran.txt; echo ok"})), say("${0}"))
    created = await runtime.create_root(scope, input_text=text, agent_id=agent_id)
    tree_id = created["session"]["session_id"]
    requests = await eventually(lambda: rows(runtime.db, "SELECT request_id, kind, payload FROM requests "
                                             "WHERE tree_id = %s AND status = 'pending'", tree_id))
    assert requests[0]["kind"] == "approval"
    assert requests[0]["payload"]["command"] == "echo ran >> ran.txt; echo ok"
    workdir = await workdir_of(runtime, tree_id)
    assert not (workdir / "ran.txt").exists()
    await runtime.answer_request(scope, requests[0]["request_id"], {"decision": decision})
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    if decision == "approve":
        assert '"stdout": "ok\\n"' in result["output"]
        assert (workdir / "ran.txt").read_text() == "ran\n"
    else:
        assert DENIED in result["output"]
        assert not (workdir / "ran.txt").exists()


@pytest.mark.session_kills
async def test_finished_command_is_not_rerun_after_a_crash(runtime: Runtime, scope: Scope, how: str) -> None:
    member = script(call(("run_command", {"command": "echo once >> count.txt"})), say("$${0.exit_code}"))
    text = script(call(create("fp-runner", member)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("${1.results.0.output}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    runner = await eventually(lambda: _session(runtime, tree_id, "/root/fp-runner"))
    # The receipt is committed; the 3 s failpoint holds the tool message back: kill now.
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM tool_receipts r JOIN turns t USING (turn_id) "
                                  "WHERE t.session_id = %s AND r.tool_name = 'run_command' AND r.state = 'done'",
                                  runner))
    await kill_session_process(runtime, runner, how)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"] == "0"
    workdir = await workdir_of(runtime, tree_id)
    assert (workdir / "count.txt").read_text() == "once\n"
    recovered = await rows(runtime.db, "SELECT count(*) AS n FROM runs WHERE session_id = %s AND kind = 'resume'",
                           runner)
    assert recovered[0]["n"] >= 1
    assert await session_id_at(runtime.db, tree_id, "/root/fp-runner") == runner


async def test_stop_all_kills_commands_but_keeps_the_sandbox(runtime: Runtime, scope: Scope) -> None:
    sleeper = script(call(("run_command", {"command": "sleep 60"})), say("woke"))
    text = script(call(("run_command", {"command": "echo started > started.txt"})),
                  call(create("s1", sleeper), create("s2", sleeper)),
                  call(("wait_inputs", {"input_ids": ["${1.input_id}", "${2.input_id}"]})), say("never"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM thread_messages m JOIN sessions s USING (session_id) "
                                  "WHERE s.tree_id = %s AND s.depth = 1 AND m.role = 'assistant' "
                                  "GROUP BY s.tree_id HAVING count(*) = 2", tree_id))
    await asyncio.sleep(0.5)
    lease_before = await rows(runtime.db, "SELECT handle, state FROM sandbox_leases WHERE tree_id = %s", tree_id)
    await runtime.stop_tree(scope, tree_id)
    await runtime.wait_tree_idle(scope, tree_id, timeout=30)
    statuses = await rows(runtime.db, "SELECT t.status, s.path FROM turns t JOIN sessions s USING (session_id) "
                          "WHERE s.tree_id = %s", tree_id)
    assert {r["status"] for r in statuses} == {"cancelled"}, statuses
    lease_after = await rows(runtime.db, "SELECT handle, state FROM sandbox_leases WHERE tree_id = %s", tree_id)
    assert lease_after == lease_before and lease_after[0]["state"] == "active"
    receipt = await runtime.submit_input(scope, tree_id, script(call(("run_command", {"command": "cat started.txt"})),
                                                                 say("${0.stdout}")))
    again = await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    # Seen once in CI (hosted): an empty output, not reproduced locally. The root's history says why next time.
    assert again["output"] == "started\n", await rows(
        runtime.db, "SELECT id, turn_id, role, left(content, 500) AS content, tool_calls, tool_call_id, origin "
        "FROM thread_messages WHERE session_id = %s ORDER BY id", tree_id)
    assert (await rows(runtime.db, "SELECT handle FROM sandbox_leases WHERE tree_id = %s", tree_id)) == \
        [{"handle": lease_before[0]["handle"]}]
