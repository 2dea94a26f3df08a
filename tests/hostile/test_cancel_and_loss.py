"""Cancel and loss are exact: a cancelled Turn runs no further tool call, and a command whose Run
was lost is stopped and reported as of unknown outcome — never run again silently.

Sessions named ``fp-…`` pause 3 s at the failpoints tests/conftest.py configures: after a reply
with tool calls is committed (``after_model_commit``), which is where a cancel must still stop them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import psutil

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence import turns
from persistence.databases import rows
from persistence.records import Row, Scope
from tests.actors.helpers import (
    BEATING,
    alive_sandbox_hosts,
    assert_stopped,
    eventually,
    failing_once,
    kill_session_process,
)
from tests.hostile.helpers import workdir_of


async def _member(runtime: Runtime, tree_id: uuid.UUID, path: str) -> uuid.UUID:
    found = await rows(runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND path = %s", tree_id, path)
    return found[0]["session_id"] if found else None  # type: ignore[return-value]


async def _open_turn(runtime: Runtime, session_id: uuid.UUID) -> uuid.UUID | None:
    found = await rows(runtime.db, "SELECT turn_id FROM turns WHERE session_id = %s AND status = 'running'",
                       session_id)
    return found[0]["turn_id"] if found else None


async def test_a_cancelled_turn_runs_none_of_its_committed_calls(runtime: Runtime, scope: Scope) -> None:
    member = script(call(create("victim", script(say("should not exist"))),
                         ("send_message", {"target": "/root", "text": "should not arrive"}),
                         ("write_file", {"path": "cancelled.txt", "content": "x"})),
                    say("never"))
    text = script(call(create("fp-member", member)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("${1.results.0.status}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    member_id = await eventually(lambda: _member(runtime, tree_id, "/root/fp-member"))
    turn_id = await eventually(lambda: _open_turn(runtime, member_id))
    # The reply with the calls is committed; the failpoint holds the calls back for 3 s: cancel now,
    # as a commit whose hint to the actor is lost (hints may be lost: the committed fact must win).
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM thread_messages WHERE session_id = %s "
                                  "AND role = 'assistant'", member_id), every=0.05)
    async with runtime.db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, member_id, turn_id, reason="cancelled by the test")
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "cancelled"
    assert [s["path"] for s in await rows(runtime.db, "SELECT path FROM sessions WHERE tree_id = %s ORDER BY path",
                                          tree_id)] == ["/root", "/root/fp-member"]
    assert await rows(runtime.db, "SELECT 1 FROM coop_messages WHERE sender_session_id = %s", member_id) == []
    assert await rows(runtime.db, "SELECT 1 FROM tool_receipts WHERE turn_id = %s", turn_id) == []
    assert await rows(runtime.db, "SELECT 1 FROM thread_messages WHERE turn_id = %s AND role = 'tool'", turn_id) == []
    assert not (await workdir_of(runtime, tree_id) / "cancelled.txt").exists()
    # The calls left unanswered stay in the member's history; a provider refuses a request with an
    # unanswered call (the scripted model does too), so the member's next Turn is told they did not run.
    later = await runtime.submit_input(scope, member_id, script(say("after")))
    result = await runtime.wait_result(scope, later["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "after")


# What a member that ran a command says, and what its root then says: the command's outcome.
_SAYS_OUTCOME = "$${0.outcome}: $${0.error}"
_SAYS_RESULT = "${1.results.0.output}"


async def _run_in_member(runtime: Runtime, scope: Scope, command: str, member_says: str,
                         root_says: str) -> tuple[Row, Path, uuid.UUID]:
    """A root whose member ``/root/runner`` runs ``command`` and says ``member_says``, while the root
    waits for it and then says ``root_says``: the root's creation, the tree's workdir, the member."""
    member = script(call(("run_command", {"command": command})), say(member_says))
    text = script(call(create("runner", member)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say(root_says))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    workdir = await workdir_of(runtime, tree_id)
    return created, workdir, await eventually(lambda: _member(runtime, tree_id, "/root/runner"))


async def _outcomes(runtime: Runtime, member: uuid.UUID) -> list[tuple[str, str]]:
    """The state and recorded outcome of each command receipt of the member."""
    receipts = await rows(runtime.db, "SELECT state, result FROM tool_receipts r JOIN turns t USING (turn_id) "
                          "WHERE t.session_id = %s", member)
    return [(r["state"], r["result"]["outcome"]) for r in receipts]


async def test_a_cancel_whose_signal_is_lost_stops_a_running_command(runtime: Runtime, scope: Scope) -> None:
    # The cancel is committed while the member's command runs, and its hint to the actor is lost:
    # the Run's next heartbeat reads the Turn being cancelled and stops the command, instead of
    # letting it run to its end (Stop all promises the commands of its Turns are interrupted).
    created, workdir, runner = await _run_in_member(runtime, scope, BEATING, "finished", "${1.results.0.status}")
    turn_id = await eventually(lambda: _open_turn(runtime, runner))
    await eventually(lambda: _started(workdir / "running.txt"), every=0.05)
    async with runtime.db.tx() as conn:
        assert await turns.cancel_turn(conn, scope, runner, turn_id, reason="cancelled by the test")
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "cancelled"
    await assert_stopped(workdir)
    assert [r["status"] for r in await rows(runtime.db, "SELECT status FROM turns WHERE turn_id = %s",
                                            turn_id)] == ["cancelled"]


async def test_a_cancelled_turn_ends_only_once_its_running_command_is_killed(runtime: Runtime, scope: Scope) -> None:
    # Ray's cancel of the sandbox host's call is a request the host acts on when it can: the Run
    # ended and its Turn was committed cancelled while the command still ran (and for good, had the
    # request been lost). The Run kills the command itself now, and its Turn ends after that kill:
    # with the host stopped (SIGSTOP: alive, answering nothing), the Turn stays cancelling.
    created, workdir, runner = await _run_in_member(runtime, scope, BEATING, "finished", "${1.results.0.status}")
    turn_id = await eventually(lambda: _open_turn(runtime, runner))
    await eventually(lambda: _started(workdir / "running.txt"), every=0.05)
    host = int((await alive_sandbox_hosts())[0].pid)
    os.kill(host, signal.SIGSTOP)
    try:
        await runtime.cancel_turn(scope, runner, turn_id)
        await asyncio.sleep(3)  # the Run has been told long since (it would have ended in ~0.1 s)
        status = await rows(runtime.db, "SELECT status FROM turns WHERE turn_id = %s", turn_id)
        assert status == [{"status": "cancelling"}]
    finally:
        os.kill(host, signal.SIGCONT)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == "cancelled"
    await assert_stopped(workdir)


async def test_a_command_of_a_lost_run_is_stopped_and_reported_unknown(runtime: Runtime, scope: Scope) -> None:
    # The member's command starts, writes "start", and would write "end" 8 s later; its actor dies
    # at once. The sweeper stops the command before resuming the Turn, which is told the outcome is
    # unknown instead of running the command again.
    created, workdir, runner = await _run_in_member(runtime, scope, BEATING, _SAYS_OUTCOME, _SAYS_RESULT)
    await eventually(lambda: _started(workdir / "running.txt"), every=0.05)
    await kill_session_process(runtime, runner, "kill -9")
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"].startswith("unknown: an earlier run of this turn started this command")
    await assert_stopped(workdir)
    assert await _outcomes(runtime, runner) == [("done", "unknown")]


async def test_a_command_whose_outcome_cannot_be_recorded_is_reported_unknown(runtime: Runtime, scope: Scope) -> None:
    # The command ran, and the database failed the statement recording its outcome. That was
    # committed as "internal error in run_command" with the receipt left started: the model, told
    # it failed, could run it again. The Run now gives up instead; recovery reports it unknown.
    marker = uuid.uuid4().hex
    async with failing_once(runtime.db, "tool_receipts",
                            f"NEW.state = 'done' AND NEW.arguments->>'command' LIKE '%{marker}%'"):
        created, workdir, runner = await _run_in_member(runtime, scope, f"echo {marker} >> log.txt",
                                                        _SAYS_OUTCOME, _SAYS_RESULT)
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"].startswith("unknown: an earlier run of this turn started this command"), result
    assert (workdir / "log.txt").read_text() == f"{marker}\n"
    assert await _outcomes(runtime, runner) == [("done", "unknown")]


async def test_a_sandbox_host_that_does_not_answer_holds_up_only_its_own_runs(runtime: Runtime, scope: Scope) -> None:
    # A lost Run's command is stopped before its Turn resumes, through the sandbox's host. That host
    # is stopped (SIGSTOP: alive, answering nothing), so the stop waits; the sweeper recovered Runs
    # one after another, and every other lost Run waited behind it for as long. Now it waits alone.
    command = "echo start >> log.txt; sleep 47.3917; echo end >> log.txt"  # its sleep names it among processes
    created, workdir, runner = await _run_in_member(runtime, scope, command, _SAYS_OUTCOME, _SAYS_RESULT)
    other = await runtime.create_root(scope, input_text=script(
        call(create("sleeper", script(say("slept", delay_ms=6000)))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("other ${1.results.0.output}")))
    sleeper = await eventually(lambda: _member(runtime, other["session"]["session_id"], "/root/sleeper"))
    await eventually(lambda: _started(workdir / "log.txt"), every=0.05)
    await eventually(lambda: _open_turn(runtime, sleeper))
    host = int((await alive_sandbox_hosts())[0].pid)
    os.kill(host, signal.SIGSTOP)
    try:
        await kill_session_process(runtime, runner, "kill -9")
        if await runtime.placement.session_status(sleeper) is not None:  # not in the process just killed
            await kill_session_process(runtime, sleeper, "kill -9")
        # The sleeper's Run is dead either way: its lease runs out after the runner's.
        async with runtime.db.tx() as conn:
            await conn.execute("UPDATE runs SET lease_expires_at = now() + interval '6 seconds' "
                               "WHERE session_id = %s AND status = 'running'", (sleeper,))
        result = await runtime.wait_result(scope, other["input"]["input_id"], timeout=60)
        assert (result["status"], result["output"]) == ("completed", "other slept"), result
        assert await _open_turn(runtime, runner) is not None  # its command could not be stopped yet
    finally:
        os.kill(host, signal.SIGCONT)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    assert result["output"].startswith("unknown: an earlier run of this turn started this command"), result
    assert await eventually(_no_process_sleeping_47, timeout=10)
    assert (workdir / "log.txt").read_text() == "start\n"
    assert await _outcomes(runtime, runner) == [("done", "unknown")]


async def _no_process_sleeping_47() -> bool:
    def sleeping() -> list[int]:
        return [process.pid for process in psutil.process_iter(["cmdline"])
                if "47.3917" in (process.info["cmdline"] or []) and "sleep" in process.info["cmdline"][0]]

    return not await asyncio.to_thread(sleeping)


async def _started(path: os.PathLike[str]) -> bool:
    return os.path.exists(path)
