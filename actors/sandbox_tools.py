"""The sandbox tools: ``run_command``, ``read_file`` and ``write_file`` in the caller's tree sandbox.

``run_command`` and ``write_file`` are side effects. Under an ``ask`` Turn (its session asks,
or the work came from a Turn that asks) each first parks the Turn for a human approval, and
runs only once approved. Both are keyed by (Turn, tool call id): a replayed Run returns the
stored outcome instead of acting again.

A command's receipt is committed as ``started`` before the command starts, and its outcome
replaces that when it ends. A Run that finds its call ``started`` knows an earlier Run of the
Turn began the command and died or lost its lease before recording how it ended: the command
is stopped if it still runs, and the model is told its outcome is unknown — never run again
silently. (The sweeper also stops such commands before it resumes the Turn in a new Run.)
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path

from pydantic import Field

from actors import failpoints
from actors.tools import Park, SandboxTool, ToolArgs, ToolContext, ToolResult
from persistence import projects, receipts, waits
from persistence import runs as run_repo
from persistence.db import Database
from sandbox import files
from sandbox.base import SandboxError
from sandbox.manager import SandboxManager

DENIED = "the human denied this call; it did not run"
UNKNOWN_OUTCOME = (
    "an earlier run of this turn started this command and stopped (it lost its lease or its process died) "
    "before the command's outcome was recorded: it may have run partly or fully. It was stopped if it still "
    "ran, and it is not run again: check its effects before deciding to run it again")

_managers: dict[Database, SandboxManager] = {}
_managers_lock = asyncio.Lock()


async def sandbox_manager(db: Database) -> SandboxManager:
    """One manager per process and database (it holds the Docker client)."""
    async with _managers_lock:
        if db not in _managers:
            _managers[db] = await asyncio.to_thread(SandboxManager.from_settings, db)
        return _managers[db]


def command_id(turn_id: uuid.UUID, call_id: str) -> str:
    """The sandbox's id of a call's command: the same for every Run of the Turn, so any of them
    (or the sweeper) can stop the command a dead Run started."""
    return hashlib.sha256(f"{turn_id}:{call_id}".encode()).hexdigest()[:32]


async def stop_started_commands(db: Database, run_id: uuid.UUID) -> None:
    """Stop every command this Run started whose outcome it never recorded (before its Turn may
    resume in a new Run). Raises if the sandbox cannot be asked: the caller tries again later."""
    async with db.tx() as conn:
        started = await receipts.started_commands(conn, run_id)
    if not started:
        return
    manager = await sandbox_manager(db)
    for row in started:
        await manager.kill_command(row["tree_id"], command_id(row["turn_id"], row["tool_call_id"]))


class RunCommandArgs(ToolArgs):
    command: str = Field(min_length=1, max_length=100_000)
    timeout_seconds: int = Field(default=120, ge=1, le=3600)


class ReadFileArgs(ToolArgs):
    path: str = Field(description="A path relative to the project workdir (/workspace in the sandbox).")


class WriteFileArgs(ToolArgs):
    path: str = Field(description="A path relative to the project workdir.")
    content: str = Field(max_length=10_000_000)


async def _workdir(ctx: ToolContext) -> Path:
    async with ctx.db.tx() as conn:
        project = await projects.get_project(conn, ctx.run.scope, ctx.session["project_id"])
    workdir = Path(project["workdir"])
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    return workdir


async def _approved(ctx: ToolContext, call_id: str, request: dict[str, object]) -> ToolResult | None:
    """None when the call may run now; else what the call answers: a park that asks a human
    (an ask Turn's first attempt), or the denial."""
    assert ctx.dispatcher is not None, "a tool step sets its dispatcher before its calls run"
    if ctx.dispatcher.approval_mode != "ask":
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
    manager = await sandbox_manager(ctx.db)
    if prior is not None and prior.state == "done":
        return prior.result
    if prior is not None:  # started by an earlier Run that never recorded how it ended
        await manager.kill_command(ctx.run.tree_id, command_id(ctx.run.turn_id, call_id))
        return await _record_outcome(ctx, call_id, {"outcome": "unknown", "error": UNKNOWN_OUTCOME})
    refused = await _approved(ctx, call_id, {"tool": "run_command", "command": args.command})
    if refused is not None:
        return refused
    workdir = await _workdir(ctx)
    async with ctx.db.tx() as conn:  # committed before the command starts: it never runs twice unasked
        await run_repo.fence(conn, ctx.run)
        await receipts.start_command(conn, ctx.run, call_id, "run_command", key)
    try:
        result = await manager.run_command(ctx.run.tree_id, workdir, args.command, args.timeout_seconds,
                                           command_id=command_id(ctx.run.turn_id, call_id))
        outcome = result.as_tool_result()
    except SandboxError as error:  # the sandbox could not start it: it did not run
        outcome = {"error": str(error)}
    outcome = await _record_outcome(ctx, call_id, outcome)
    await failpoints.pause("after_command_receipt", ctx.session["name"])
    return outcome


async def _record_outcome(ctx: ToolContext, call_id: str, outcome: ToolResult) -> ToolResult:
    async with ctx.db.tx() as conn:
        await run_repo.fence(conn, ctx.run)
        await receipts.finish_command(conn, ctx.run, call_id, outcome)
    return outcome


async def read_file(ctx: ToolContext, call_id: str, args: ReadFileArgs) -> ToolResult:
    workdir = await _workdir(ctx)
    content = await asyncio.to_thread(files.read_file, workdir, args.path)
    return {"path": args.path, "content": content}


async def write_file(ctx: ToolContext, call_id: str, args: WriteFileArgs) -> ToolResult:
    data = args.content.encode()
    key = {"path": args.path, "sha256": hashlib.sha256(data).hexdigest()}
    async with ctx.db.tx() as conn:
        stored = await receipts.begin_call(conn, ctx.run, call_id, "write_file", key)
    if stored is not None:
        return stored
    refused = await _approved(ctx, call_id, {"tool": "write_file", "path": args.path, "bytes": len(data),
                                             "preview": args.content[:500]})
    if refused is not None:
        return refused
    workdir = await _workdir(ctx)
    written = await asyncio.to_thread(files.write_file, workdir, args.path, args.content)
    outcome = {"path": args.path, "bytes": written}
    async with ctx.db.tx() as conn:  # a write that is replayed before this commit writes the same bytes again
        await run_repo.fence(conn, ctx.run)
        await receipts.store_result(conn, ctx.run, call_id, "write_file", key, outcome)
    return outcome


SANDBOX_TOOLS: list[SandboxTool] = [
    SandboxTool("run_command", "Run a shell command in the tree's shared sandbox (workdir /workspace).",
         RunCommandArgs, run_command),
    SandboxTool("read_file", "Read a file of the project workdir.", ReadFileArgs, read_file),
    SandboxTool("write_file", "Write a file in the project workdir.", WriteFileArgs, write_file),
]
