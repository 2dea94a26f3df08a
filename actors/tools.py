"""The model tools of SPEC §9: argument schemas, and what each call does.

A tool either returns a result (committed as the tool message) or parks the Turn
(``Park``): the Run is interrupted, its slot released, and a resume Run later gives
the model the wait's outcome as this call's result. Errors become ``{"error": ...}``.

The cooperation tools here only touch the database, so each runs inside the very
transaction that commits its result (``Tool.handler`` gets that connection): the effect
and the result are one commit, so a crash loses both or neither, and a call costs one
transaction. Side-effecting tools are also keyed by (Turn, tool call id) in
``persistence.cooperation``: a second guard, since a call whose result is committed is
never run again. Tools that run outside a transaction (sandbox commands) are
``SandboxTool``s, with receipts of their own.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from persistence import agents as agent_repo
from persistence import cooperation, deadlocks, sessions, turns
from persistence.cooperation import Dispatcher
from persistence.db import MAX_BIGINT, Connection, Database
from persistence.errors import InvalidArgument, NotFound, shown
from persistence.events import session_updates_after
from persistence.records import Row, RunRef
from persistence.settings import Settings
from persistence.statuses import WaitKind

MAX_WAIT_IDS = 100
LIST_PAGE = 10
# A project's sessions a page: a project may hold thousands, and a tool result is sent again with
# every later model call of its Turn.
PROJECT_PAGE = 100


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSessionArgs(ToolArgs):
    name: str = Field(description="Local name of the new session: 1-64 letters, digits, '_' or '-'. Not a path.")
    description: str = Field(description="The task: the new session's first input and its only context.")
    agent_id: str | None = Field(default=None, description="Run the new session as this agent (see list_agents).")
    mode: Literal["child", "root"] = Field(default="child", description="child (default) or an independent root.")


class SubmitInputArgs(ToolArgs):
    target: str = Field(description="session_id, or a path in your own tree like /root/worker")
    text: str


class SendMessageArgs(ToolArgs):
    target: str = Field(description="session_id, or a path in your own tree")
    text: str = Field(max_length=100_000)


class CancelTurnArgs(ToolArgs):
    target: str
    turn_id: str


class WaitInputsArgs(ToolArgs):
    input_ids: list[str] = Field(min_length=1, max_length=MAX_WAIT_IDS)
    timeout_seconds: int = Field(default=300, ge=1, le=1800)


class WaitSessionsArgs(ToolArgs):
    targets: list[str] = Field(min_length=1, max_length=MAX_WAIT_IDS)
    # A larger cursor or offset would fail the statement, and with it the Run's transaction.
    after_cursor: int = Field(default=0, ge=0, le=MAX_BIGINT)
    timeout_seconds: int = Field(default=300, ge=1, le=1800)


class GetResultArgs(ToolArgs):
    input_id: str | None = None
    turn_id: str | None = None
    # An int4 in the statement that reads the output; no output is near that long.
    offset: int = Field(default=0, ge=0, le=2**31 - 2**20, description=(
        "Characters of the output to skip: a result whose output was cut gives its output_next_offset."))


class ListSessionsArgs(ToolArgs):
    scope: Literal["project", "all"] = "project"
    offset: int = Field(default=0, ge=0, le=MAX_BIGINT)
    include_archived: bool = Field(default=False, description="Also list the sessions of archived trees.")


class ListAgentsArgs(ToolArgs):
    offset: int = Field(default=0, ge=0, le=MAX_BIGINT)


class AskUserArgs(ToolArgs):
    question: str = Field(min_length=1, max_length=100_000)


@dataclasses.dataclass(frozen=True)
class Park:
    """Interrupt the Run into a wait; the outcome becomes this call's result on resume."""

    kind: str
    condition: dict[str, Any]
    timeout_seconds: float | None
    targets: list[uuid.UUID]
    request_payload: dict[str, Any] | None = None


@dataclasses.dataclass
class ToolContext:
    db: Database
    settings: Settings
    run: RunRef
    session: Row  # the calling session's row
    input_id: uuid.UUID  # the calling Turn's own input
    # What this step's calls pass on (approval mode, tools); set when the step begins, under its guard.
    dispatcher: Dispatcher | None = None
    touched_sessions: set[uuid.UUID] = dataclasses.field(default_factory=set)
    # Sessions whose live Run must re-read its Turn now (a cancel), not at its next boundary.
    signalled_sessions: set[uuid.UUID] = dataclasses.field(default_factory=set)


ToolResult = dict[str, Any] | Park
# A cooperation tool: called inside the transaction that will commit its result.
Handler = Callable[[ToolContext, Connection, str, Any], Awaitable[ToolResult]]
# A sandbox tool: called outside any transaction (it may run for minutes).
SandboxHandler = Callable[[ToolContext, str, Any], Awaitable[ToolResult]]


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(f"{what} {shown(value)} is not an id") from None


def _jsonable(row: Row) -> dict[str, Any]:
    return {key: (str(value) if isinstance(value, uuid.UUID) else value) for key, value in row.items()}


def _dispatcher(ctx: ToolContext) -> Dispatcher:
    assert ctx.dispatcher is not None, "a tool step sets its dispatcher before its calls run"
    return ctx.dispatcher


async def create_session(ctx: ToolContext, conn: Connection, call_id: str, args: CreateSessionArgs) -> ToolResult:
    settings = ctx.settings
    limits = cooperation.CreateLimits(max_depth=settings.max_depth, max_members=settings.max_sessions_per_tree,
                                      max_spawned_trees=settings.max_spawned_trees, slot_limit=settings.tree_slots)
    result = await cooperation.create_session(
        conn, ctx.run, call_id, name=args.name, description=args.description, agent_id=args.agent_id,
        mode=args.mode, limits=limits, dispatcher=_dispatcher(ctx))
    ctx.touched_sessions.add(uuid.UUID(result["session_id"]))
    return result


async def submit_input(ctx: ToolContext, conn: Connection, call_id: str, args: SubmitInputArgs) -> ToolResult:
    result = await cooperation.submit_input(conn, ctx.run, call_id, target=args.target, text=args.text,
                                            dispatcher=_dispatcher(ctx))
    ctx.touched_sessions.add(uuid.UUID(result["session_id"]))
    return result


async def send_message(ctx: ToolContext, conn: Connection, call_id: str, args: SendMessageArgs) -> ToolResult:
    result = await cooperation.send_message(conn, ctx.run, call_id, target=args.target, text=args.text)
    # A message is an update for wait_sessions waiters watching this sender.
    ctx.touched_sessions.add(ctx.run.session_id)
    return result


async def cancel_turn(ctx: ToolContext, conn: Connection, call_id: str, args: CancelTurnArgs) -> ToolResult:
    result = await cooperation.cancel_turn(conn, ctx.run, call_id, target=args.target, turn_id=args.turn_id)
    ctx.touched_sessions.add(uuid.UUID(result["session_id"]))
    ctx.signalled_sessions.add(uuid.UUID(result["session_id"]))
    return result


async def wait_inputs(ctx: ToolContext, conn: Connection, call_id: str, args: WaitInputsArgs) -> ToolResult:
    ids = list(dict.fromkeys(_uuid(value, "input_id") for value in args.input_ids))
    if ctx.input_id in ids:
        raise InvalidArgument("a turn cannot wait for its own input")
    results = await turns.results_of_inputs(conn, ctx.run.scope, ids, output_chars=turns.TOOL_RESULT_OUTPUT_CHARS)
    found = {result["input_id"] for result in results}
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise NotFound(f"no input {missing[0]}")
    if all(result["terminal"] for result in results):
        await turns.take_in(conn, ctx.run.turn_id, (result["turn_id"] for result in results))
        return {"results": [_jsonable(r) for r in results], "timed_out": False}
    await deadlocks.check_wait(conn, ctx.run, ctx.session["path"],
                               input_ids=[r["input_id"] for r in results if not r["terminal"]])
    return Park(kind=WaitKind.INPUTS, condition={"input_ids": [str(i) for i in ids]},
                timeout_seconds=args.timeout_seconds,
                targets=list(dict.fromkeys(result["session_id"] for result in results)))


async def wait_sessions(ctx: ToolContext, conn: Connection, call_id: str, args: WaitSessionsArgs) -> ToolResult:
    targets = [await sessions.resolve_target(conn, ctx.run.scope, ctx.run.tree_id, t) for t in args.targets]
    ids = list(dict.fromkeys(target["session_id"] for target in targets))
    if ctx.run.session_id in ids:
        raise InvalidArgument("a session cannot wait for itself")
    updates = await session_updates_after(conn, ctx.run.scope, ctx.run.session_id, ids, args.after_cursor)
    if updates:
        await turns.take_in(conn, ctx.run.turn_id, (update["turn_id"] for update in updates))
        return {"updates": [_jsonable(u) for u in updates], "cursor": updates[-1]["cursor"], "timed_out": False}
    await deadlocks.check_wait(conn, ctx.run, ctx.session["path"], session_ids=ids)
    return Park(kind=WaitKind.SESSIONS, condition={"targets": [str(i) for i in ids], "after_cursor": args.after_cursor},
                timeout_seconds=args.timeout_seconds, targets=ids)


async def get_result(ctx: ToolContext, conn: Connection, call_id: str, args: GetResultArgs) -> ToolResult:
    if (args.input_id is None) == (args.turn_id is None):
        raise InvalidArgument("give exactly one of input_id and turn_id")
    window = {"output_chars": turns.TOOL_RESULT_OUTPUT_CHARS, "offset": args.offset}
    if args.input_id is not None:
        result = await turns.get_result(conn, ctx.run.scope, input_id=_uuid(args.input_id, "input_id"), **window)
    else:
        result = await turns.get_result(conn, ctx.run.scope, turn_id=_uuid(str(args.turn_id), "turn_id"), **window)
    await turns.take_in(conn, ctx.run.turn_id, [result["turn_id"]])
    return _jsonable(result)


_LISTED = ("session_id", "title", "path", "tree_id", "project_id", "current_turn_id", "turn_status",
           "waiting_for", "activity", "status")


async def list_sessions(ctx: ToolContext, conn: Connection, call_id: str, args: ListSessionsArgs) -> ToolResult:
    if args.scope == "project":
        page = PROJECT_PAGE
        rows = await sessions.list_project_sessions(conn, ctx.run.scope, ctx.session["project_id"], offset=args.offset,
                                                    limit=page, include_archived=args.include_archived)
    else:
        page = LIST_PAGE
        rows = await sessions.list_scope_sessions(conn, ctx.run.scope, offset=args.offset, limit=page,
                                                  include_archived=args.include_archived)
    entries = [{key: row[key] for key in _LISTED} for row in rows]
    entries = [{**_jsonable(e), "root_id": str(e["tree_id"])} for e in entries]
    return _page("sessions", entries, args.offset, page)


async def list_agents(ctx: ToolContext, conn: Connection, call_id: str, args: ListAgentsArgs) -> ToolResult:
    rows = await agent_repo.list_agents(conn, ctx.run.scope, offset=args.offset, limit=LIST_PAGE)
    entries = [{"id": r["agent_id"], "name": r["name"], "description": r["description"]} for r in rows]
    return _page("agents", entries, args.offset, LIST_PAGE)


def _page(key: str, entries: list[dict[str, Any]], offset: int, size: int) -> ToolResult:
    """A list tool's page: its entries under ``key``, and where the next page starts (None: the last)."""
    return {key: entries, "offset": offset, "next_offset": offset + size if len(entries) == size else None}


async def ask_user(ctx: ToolContext, conn: Connection, call_id: str, args: AskUserArgs) -> ToolResult:
    return Park(kind=WaitKind.ANSWER, condition={}, timeout_seconds=None, targets=[],
                request_payload={"question": args.question})


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """What the model sees of a tool: its name, description and argument schema."""

    name: str
    description: str
    args: type[ToolArgs]


@dataclasses.dataclass(frozen=True)
class Tool(ToolSpec):
    handler: Handler
    # Acts on other sessions (creates, submits, messages, cancels). Such a call runs only after
    # the reply that made it is committed; a reply whose calls only read or wait is committed
    # together with their results.
    acts: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxTool(ToolSpec):
    handler: SandboxHandler


COOPERATION_TOOLS: list[Tool] = [
    Tool("create_session", "Create a session (a child by default) and submit its first input, the "
         "description. It sees only the description, never your history.", CreateSessionArgs, create_session,
         acts=True),
    Tool("submit_input", "Give a session new work (FIFO: queued if it is busy).", SubmitInputArgs, submit_input,
         acts=True),
    Tool("send_message", "Send context to a session: read at its next model call; starts no work.",
         SendMessageArgs, send_message, acts=True),
    Tool("cancel_turn", "Cancel exactly one turn of a session; status already_ended when it had ended (its result "
                        "stays as it was: get_result reads it).", CancelTurnArgs, cancel_turn, acts=True),
    Tool("wait_inputs", "Wait until all these inputs are finished; returns their exact results (outputs "
         f"of {turns.TOOL_RESULT_OUTPUT_CHARS:,} characters in all at most: a cut one gives its output_next_offset, "
         "from which get_result reads on).", WaitInputsArgs, wait_inputs),
    Tool("wait_sessions", "Wait until any of these sessions has an update after the cursor.",
         WaitSessionsArgs, wait_sessions),
    Tool("get_result", f"The exact result of one input or turn (at most {turns.TOOL_RESULT_OUTPUT_CHARS:,} "
         "characters of its output from offset on: a cut one gives its output_next_offset).", GetResultArgs,
         get_result),
    Tool("list_sessions", f"Sessions of this project ({PROJECT_PAGE} a page), or your whole history "
         f"(scope='all', {LIST_PAGE} a page, newest first); archived trees only with include_archived.",
         ListSessionsArgs, list_sessions),
    Tool("list_agents", f"Agents you may run in create_session(agent_id=...), {LIST_PAGE} a page, each with the "
                        "beginning of its description.", ListAgentsArgs, list_agents),
    Tool("ask_user", "Ask the human a question and wait for the answer.", AskUserArgs, ask_user),
]
