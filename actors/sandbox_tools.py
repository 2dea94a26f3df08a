"""The sandbox tools: ``run_command``, ``read_file`` and ``write_file`` in the caller's tree sandbox.

``run_command`` is a side effect: once it has finished its result is stored as a receipt
keyed by (Turn, tool call id) before anything else happens, so a replayed Run returns
the stored result instead of running it again. A command interrupted by a crash has no
receipt and runs again (at-least-once for unfinished commands). With
``approval_mode = ask`` the call first parks the Turn for a human approval.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import Field

from actors import failpoints
from actors.tools import Park, SandboxTool, ToolArgs, ToolContext, ToolResult
from persistence import projects, receipts
from persistence import runs as run_repo
from persistence.db import Database
from sandbox import files
from sandbox.manager import SandboxManager

DENIED = "the human denied this command; it did not run"
_APPROVAL_STATE = """
SELECT w.status AS wait_status, r.status AS request_status, r.response
FROM waits w JOIN requests r ON r.wait_id = w.wait_id
WHERE w.turn_id = %s AND w.tool_call_id = %s AND w.kind = 'approval'
ORDER BY w.created_at DESC LIMIT 1
"""

_managers: dict[int, SandboxManager] = {}
_managers_lock = asyncio.Lock()


async def sandbox_manager(db: Database) -> SandboxManager:
    """One manager per process and database (it holds the Docker client)."""
    async with _managers_lock:
        if id(db) not in _managers:
            _managers[id(db)] = SandboxManager.from_settings(db)
        return _managers[id(db)]


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


async def _approval(ctx: ToolContext, call_id: str) -> str | None:
    """None (not asked yet), 'pending', 'approve' or 'deny'."""
    async with ctx.db.tx() as conn:
        cur = await conn.execute(_APPROVAL_STATE, (ctx.run.turn_id, call_id))
        row = await cur.fetchone()
    if row is None:
        return None
    if row["request_status"] != "answered":
        return "pending"
    return (row["response"] or {}).get("decision", "deny")


async def run_command(ctx: ToolContext, call_id: str, args: RunCommandArgs) -> ToolResult:
    key = {"command": args.command, "timeout_seconds": args.timeout_seconds}
    async with ctx.db.tx() as conn:
        stored = await receipts.begin_call(conn, ctx.run, call_id, "run_command", key)
    if stored is not None:
        return stored
    if ctx.session["agent_config"].get("approval_mode") == "ask":
        decision = await _approval(ctx, call_id)
        if decision is None:
            return Park(kind="approval", condition={}, timeout_seconds=None, targets=[],
                        request_payload={"command": args.command, "tool_call_id": call_id})
        if decision != "approve":
            return {"error": DENIED}
    manager = await sandbox_manager(ctx.db)
    result = await manager.run_command(ctx.run.tree_id, await _workdir(ctx), args.command, args.timeout_seconds)
    outcome = result.as_tool_result()
    async with ctx.db.tx() as conn:
        await run_repo.fence(conn, ctx.run)
        await receipts.store_result(conn, ctx.run, call_id, "run_command", key, outcome)
    await failpoints.pause("after_command_receipt", ctx.session["name"])
    return outcome


async def read_file(ctx: ToolContext, call_id: str, args: ReadFileArgs) -> ToolResult:
    workdir = await _workdir(ctx)
    content = await asyncio.to_thread(files.read_file, workdir, args.path)
    return {"path": args.path, "content": content}


async def write_file(ctx: ToolContext, call_id: str, args: WriteFileArgs) -> ToolResult:
    workdir = await _workdir(ctx)
    written = await asyncio.to_thread(files.write_file, workdir, args.path, args.content)
    return {"path": args.path, "bytes": written}


SANDBOX_TOOLS: list[SandboxTool] = [
    SandboxTool("run_command", "Run a shell command in the tree's shared sandbox (workdir /workspace).",
         RunCommandArgs, run_command),
    SandboxTool("read_file", "Read a file of the project workdir.", ReadFileArgs, read_file),
    SandboxTool("write_file", "Write a file in the project workdir.", WriteFileArgs, write_file),
]
