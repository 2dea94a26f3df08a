"""The sandbox tools: ``run_command``, ``read_file`` and ``write_file`` in the caller's tree sandbox.

``run_command`` and ``write_file`` are side effects. Under an ``ask`` Turn (its session asks,
or the work came from a Turn that asks) each first parks the Turn for a human approval, and
runs only once approved. Both are keyed by (Turn, tool call id): a replayed Run returns the
stored outcome instead of acting again. A human approves all of what is done: the approval shows
the whole command, or the whole content of the file, so what is approved is at most
``MAX_APPROVED_CHARS`` characters; a longer write in an ``ask`` Turn is refused before it asks.

A command's receipt is committed as ``started`` before the command starts, and its outcome
replaces that when it ends. A Run that finds its call ``started`` knows an earlier Run of the
Turn began the command and died or lost its lease before recording how it ended: the command
is stopped if it still runs, and the model is told its outcome is unknown — never run again
silently. (The sweeper also stops such commands before it resumes the Turn in a new Run.)
A command whose sandbox host died while it ran is stopped too, through the host's successor: its
``docker exec`` outlives the host, and its timeout died with it. A Run cancelled while its command
runs (its Turn cancelled, a Stop all) kills the command itself before it ends: Ray's cancel of the
host's call is a request that may arrive after the Turn's end is committed, or never.

Every call runs in the sandbox host of the node holding the tree's sandbox and workdir
(actors/sandbox_hosts.py ``host_for``). Once that node is gone, each member's next call says so in
its result (``workdir_lost``, ``notice``), recorded with it, and runs in a new sandbox on the
caller's node; the commit of that result records the member told (``record_told``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from pydantic import AfterValidator, Field, field_validator

from actors import failpoints, sandbox_hosts
from actors.tools import Park, SandboxTool, ToolArgs, ToolContext, ToolResult
from persistence import projects, receipts, sandbox_leases, waits
from persistence import runs as run_repo
from persistence.db import Connection, Database
from persistence.errors import CanopyError, LeaseLost
from persistence.records import Row, RunRef
from sandbox.base import PathRejected, SandboxError
from sandbox.files import check_relative

log = logging.getLogger(__name__)
T = TypeVar("T")

DENIED = "the human denied this call; it did not run"
UNKNOWN_OUTCOME = (
    "an earlier run of this turn started this command and stopped (it lost its lease or its process died) "
    "before the command's outcome was recorded: it may have run partly or fully. It was stopped if it still "
    "ran, and it is not run again: check its effects before deciding to run it again")
HOST_LOST_STOPPED = (
    "the sandbox host stopped while this command ran (it died, or its node left the cluster): the command may "
    "have run partly or fully. It was stopped if it still ran, and it is not run again: check its effects "
    "before deciding to run it again")
# How long a call whose host died is asked again of the host's successor (a command: its kill)
# before the Run tells the model (a command: hands it to recovery): a restart takes seconds, and
# the Run's heartbeat goes on meanwhile.
_SUCCESSOR_WAIT_SECONDS = 30.0
_SUCCESSOR_POLL_SECONDS = 0.5
# How long a cancelled Run waits for its command's kill: a host that does not answer holds up the
# cancel (a Stop all, the Turn's end) no longer than this.
_KILL_AFTER_CANCEL_SECONDS = 10.0


class CommandNotStopped(LeaseLost):
    """A started command whose outcome this Run cannot record: its host died and it could not be
    killed, or recording failed (a database error). The Run gives up its lease, like one that lost
    it: the receipt stays ``started``, so the sweeper's recovery of the Run kills the command
    (retrying each sweep) before the Turn resumes, and the resumed Run tells the model the outcome
    is unknown. A tool error would instead be committed as the call's result, the command might
    still run with nothing to stop it, and a model told it failed may run it again."""


def command_id(turn_id: uuid.UUID, call_id: str) -> str:
    """The sandbox's id of a call's command: the same for every Run of the Turn, so any of them
    (or the sweeper) can stop the command a dead Run started."""
    return hashlib.sha256(f"{turn_id}:{call_id}".encode()).hexdigest()[:32]


async def stop_commands(db: Database, started: list[Row]) -> None:
    """Stop the commands a Run started whose outcome it never recorded (``receipts.started_commands``),
    before its Turn may resume in a new Run. Raises if the sandbox cannot be asked: the caller tries
    again later."""
    for row in started:
        await sandbox_hosts.kill_command(db, row["tree_id"], command_id(row["turn_id"], row["tool_call_id"]))


# The most a human is asked to read whole in one approval: a command is never longer, nor, in a
# Turn that asks, a write's content (an approval that showed only a part would approve the rest unseen).
MAX_APPROVED_CHARS = 100_000


# Linux's limit on one argument of a process (MAX_ARG_STRLEN, its NUL included): the command is one
# (``sh -c``), and past it no process starts; 100,000 characters of most scripts are more bytes.
MAX_COMMAND_BYTES = 131_071


class RunCommandArgs(ToolArgs):
    command: str = Field(min_length=1, max_length=MAX_APPROVED_CHARS)
    timeout_seconds: int = Field(default=120, ge=1, le=3600)

    @field_validator("command")
    @classmethod
    def _one_argument(cls, command: str) -> str:
        size = len(command.encode(errors="surrogatepass"))
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"the command is {size:,} bytes in UTF-8; a process takes one of at most "
                             f"{MAX_COMMAND_BYTES:,}")
        return command


def _inside_a_workdir(path: str) -> str:
    """Refuse, as the call is read, a path the sandbox would refuse: before a human is asked to
    approve a write that could never be made (the card showed a path of any length)."""
    try:
        check_relative(path)
    except PathRejected as rejected:
        raise ValueError(str(rejected)) from None
    return path


WorkdirPath = Annotated[str, AfterValidator(_inside_a_workdir)]


class ReadFileArgs(ToolArgs):
    path: WorkdirPath = Field(description="A path relative to the project workdir (/workspace in the sandbox).")


class WriteFileArgs(ToolArgs):
    path: WorkdirPath = Field(description="A path relative to the project workdir.")
    content: str = Field(max_length=10_000_000, description=(
        f"The file's whole text. Where a human approves each write, at most {MAX_APPROVED_CHARS:,} characters."))


async def _workdir(ctx: ToolContext) -> str:
    """The project's workdir path, on the node of the host that uses it (which makes it)."""
    async with ctx.db.tx() as conn:
        project = await projects.get_project(conn, ctx.run.scope, ctx.session["project_id"])
    return str(project["workdir"])


async def _in_sandbox(ctx: ToolContext, method: str, *args: object, command: str | None = None) -> ToolResult:
    """``method`` of the host of the tree's sandbox: its result, or an ``error`` result when the sandbox
    failed (a command that could not start did not run); with the lost-workdir notice when this call
    found the tree's node gone. A tool error (a bad path, a missing file) is raised, but is an
    ``error`` result too when the workdir was lost, so that the notice reaches the model. When the
    host is lost while it runs ``command`` (a command id), that command is stopped first. Any other
    call has no outcome to be unsure of (a read; a write, whose host answers a repeat from the receipt
    it committed with the write): it is routed and asked again until the host's successor answers."""
    lost = False

    async def ask() -> ToolResult:
        nonlocal lost
        host, lost = await sandbox_hosts.host_for(ctx.db, ctx.run.tree_id, ctx.run.session_id)
        return await sandbox_hosts.call(host, method, *args)

    try:
        result = await (ask() if command is not None else _until_the_successor_answers(ask))
    except sandbox_hosts.HostLost as error:
        result = {"error": str(error)} if command is None else await _stop_orphaned(ctx, command, error)
    except SandboxError as error:
        result = {"error": str(error)}
    except LeaseLost:
        raise  # this Run is stale: it stops, whatever else there is to tell
    except CanopyError as error:
        if not lost:
            raise
        result = {"error": str(error), **error.details}
    return {**result, "workdir_lost": True, "notice": sandbox_hosts.WORKDIR_LOST} if lost else result


async def _until_the_successor_answers(ask: Callable[[], Awaitable[T]],
                                       lost: sandbox_hosts.HostLost | None = None) -> T:
    """``ask``, again while it finds the sandbox host lost (Ray restarting it), for at most
    :data:`_SUCCESSOR_WAIT_SECONDS` from the loss (``lost``: one the caller found already); then the
    last HostLost. The asks after a loss are bounded by that wait too: a successor that answers
    nothing (its engine hung) holds the call no longer. (Ray answers a call to an actor whose restart
    is under way, or never ends, with ActorUnavailableError: HostLost, asked again.)"""
    if lost is None:
        try:
            return await ask()
        except sandbox_hosts.HostLost as error:
            lost = error
    try:
        async with asyncio.timeout(_SUCCESSOR_WAIT_SECONDS):
            while True:
                await asyncio.sleep(_SUCCESSOR_POLL_SECONDS)
                try:
                    return await ask()
                except sandbox_hosts.HostLost as error:
                    lost = error
    except TimeoutError:
        raise lost from None


async def record_told(conn: Connection, run: RunRef, outcome: ToolResult | None) -> None:
    """In the transaction that commits a sandbox call's result: a result that told the session its
    tree's workdir was lost records it told, and it is not told again (see ``_in_sandbox``)."""
    if isinstance(outcome, dict) and outcome.get("workdir_lost"):
        await sandbox_leases.loss_told(conn, run.tree_id, run.session_id)


async def _stop_orphaned(ctx: ToolContext, command: str, lost: sandbox_hosts.HostLost) -> ToolResult:
    """Kill ``command``, whose host died while it ran (``lost``), through the host's successor
    (which fails while Ray restarts it, so the kill is tried again for a while); the outcome to
    record. Raises CommandNotStopped if it cannot be killed."""
    try:
        await _until_the_successor_answers(lambda: sandbox_hosts.kill_command(ctx.db, ctx.run.tree_id, command),
                                           lost)
    except sandbox_hosts.HostLost as error:
        raise CommandNotStopped(f"command {command}: its host died and its successor never answered") from error
    except Exception as error:
        raise CommandNotStopped(f"command {command}: its host died and it could not be killed: {error}") from error
    return {"outcome": "unknown", "error": HOST_LOST_STOPPED}


def _asks(ctx: ToolContext) -> bool:
    """This call's Turn asks a human before a side effect."""
    assert ctx.dispatcher is not None, "a tool step sets its dispatcher before its calls run"
    return ctx.dispatcher.approval_mode == "ask"


async def _approved(ctx: ToolContext, call_id: str, request: dict[str, object]) -> ToolResult | None:
    """None when the call may run now; else what the call answers: a park that asks a human
    (an ask Turn's first attempt), or the denial."""
    if not _asks(ctx):
        return None
    async with ctx.db.tx() as conn:
        decision = await waits.approval_decision(conn, ctx.run.turn_id, call_id)
    if decision is None:
        return Park(kind="approval", condition={}, timeout_seconds=None, targets=[],
                    request_payload={**request, "tool_call_id": call_id})
    return None if decision == "approve" else {"error": DENIED}


async def run_command(ctx: ToolContext, call_id: str, args: RunCommandArgs) -> ToolResult:
    key = {"command": args.command, "timeout_seconds": args.timeout_seconds}
    async with ctx.db.tx() as conn:
        prior = await receipts.begin_attempt(conn, ctx.run, call_id, "run_command", key)
    if prior is not None and prior.state == "done":
        return prior.result
    command = command_id(ctx.run.turn_id, call_id)
    if prior is not None:  # started by an earlier Run that never recorded how it ended
        await sandbox_hosts.kill_command(ctx.db, ctx.run.tree_id, command)
        return await _record_outcome(ctx, call_id, {"outcome": "unknown", "error": UNKNOWN_OUTCOME})
    refused = await _approved(ctx, call_id, {"tool": "run_command", **key})  # all it approves: its time too
    if refused is not None:
        return refused
    workdir = await _workdir(ctx)
    async with ctx.db.tx() as conn:  # committed before the command starts: it never runs twice unasked
        await run_repo.fence(conn, ctx.run)
        await receipts.start_command(conn, ctx.run, call_id, "run_command", key)
    try:
        outcome = await _in_sandbox(ctx, "run_command", ctx.run.tree_id, workdir, args.command,
                                    args.timeout_seconds, command, command=command)
        outcome = await _record_outcome(ctx, call_id, outcome)
    except asyncio.CancelledError:
        kill = asyncio.create_task(_kill_after_cancel(ctx, command))
        while not kill.done():  # told again meanwhile (a beat, a hint), the Run still waits for the kill
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(kill)
        raise
    except CanopyError:
        raise
    except Exception as error:  # a database error recording the outcome, an error no layer below names
        raise CommandNotStopped(f"command {command}: its outcome is not recorded ({error})") from error
    await failpoints.pause("after_command_receipt", ctx.session["name"])
    return outcome


async def _kill_after_cancel(ctx: ToolContext, command: str) -> None:
    """Kill ``command``, whose Run was cancelled while it ran, before the Run ends (and its Turn's end
    is committed). Best effort, bounded: a kill that fails (its host lost, or not answering) is
    logged, and the command is left to Ray's cancel of the host's call, as before this kill."""
    try:
        await asyncio.wait_for(sandbox_hosts.kill_command(ctx.db, ctx.run.tree_id, command),
                               _KILL_AFTER_CANCEL_SECONDS)
    except Exception:
        log.warning("command %s: its Run was cancelled and killing it failed", command, exc_info=True)


async def _record_outcome(ctx: ToolContext, call_id: str, outcome: ToolResult) -> ToolResult:
    async with ctx.db.tx() as conn:
        await run_repo.fence(conn, ctx.run)
        await receipts.finish_command(conn, ctx.run, call_id, outcome)
    return outcome


async def read_file(ctx: ToolContext, call_id: str, args: ReadFileArgs) -> ToolResult:
    return await _in_sandbox(ctx, "read_file", ctx.run.tree_id, await _workdir(ctx), args.path)


async def write_file(ctx: ToolContext, call_id: str, args: WriteFileArgs) -> ToolResult:
    data = args.content.encode()
    key = {"path": args.path, "sha256": hashlib.sha256(data).hexdigest()}
    async with ctx.db.tx() as conn:
        stored = await receipts.begin_call(conn, ctx.run, call_id, "write_file", key)
    if stored is not None:
        return stored
    if _asks(ctx) and len(args.content) > MAX_APPROVED_CHARS:
        # Refused before a human is asked (no request, no receipt: nothing to replay but this answer):
        # a card cannot show it whole, and a human must not approve what they were not shown.
        return {"error": f"in ask mode a human approves every write whole: at most {MAX_APPROVED_CHARS:,} "
                         f"characters per write_file; this one has {len(args.content):,}. Nothing was "
                         "written: write it as several smaller files"}
    refused = await _approved(ctx, call_id, {"tool": "write_file", "path": args.path, "bytes": len(data),
                                             "content": args.content})
    if refused is not None:
        return refused
    outcome = await _in_sandbox(ctx, "write_file", await _workdir(ctx), args.path, args.content, ctx.run, call_id,
                                key)
    if "error" in outcome:  # nothing was written, or its host's answer was lost after the write: its receipt says
        async with ctx.db.tx() as conn:
            await run_repo.fence(conn, ctx.run)
            if (written := await receipts.begin_call(conn, ctx.run, call_id, "write_file", key)) is not None:
                return written
            await receipts.store_result(conn, ctx.run, call_id, "write_file", key, outcome)
    return outcome  # a write's receipt was committed with it, by its host


SANDBOX_TOOLS: list[SandboxTool] = [
    SandboxTool("run_command", "Run a shell command in the tree's shared sandbox (workdir /workspace).",
         RunCommandArgs, run_command),
    SandboxTool("read_file", "Read a file of the project workdir.", ReadFileArgs, read_file),
    SandboxTool("write_file", "Write a file in the project workdir.", WriteFileArgs, write_file),
]
