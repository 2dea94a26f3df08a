"""One Run of a Turn: model boundary → model call → commit → tools → commit → … → result.

Everything the loop decides is derived from committed messages, so a Run that resumes
after a wait or a crash simply continues: tool calls whose results are committed are
not executed again, the rest run under their receipt key, and a model reply that was
never committed is requested again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from actors import budgets, compaction, failpoints, gateways, sandbox_tools, signals, tracing
from actors.heartbeats import Heartbeats
from actors.metrics import count_tool_call, tool_label
from actors.model_gateway import IDENTIFIER_CHARS
from actors.placement import Placement
from actors.toolbox import effective_tools, parse_args, schemas
from actors.tools import Park, SandboxTool, Tool, ToolContext, ToolResult
from persistence import messages, turns, usage, waits
from persistence import runs as run_repo
from persistence.cooperation import Dispatcher
from persistence.db import Connection, Database, DatabaseError, LockConflict, savepoint
from persistence.errors import CanopyError, Conflict, LeaseLost, TurnCancelled
from persistence.records import Row, RunRef
from persistence.sessions import TurnInput, session_and_turn_input
from persistence.settings import Settings
from persistence.statuses import RunKind, TurnStatus, WaitKind
from persistence.text import pictured, storable

log = logging.getLogger(__name__)

DEFAULT_INSTRUCTIONS = "You are a helpful assistant working in a cooperation tree of sessions."


def identity_block(session: Row, run: RunRef, input_id: uuid.UUID) -> str:
    role = "root" if session["parent_id"] is None else "child"
    lines = [
        "## Your identity (injected by Canopy)",
        f"name: {session['name']}",
        f"path: {session['path']}",
        f"session_id: {session['session_id']}",
        f"parent_id: {session['parent_id'] or 'none'}",
        f"root_id: {session['tree_id']}",
        f"role: {role}",
        f"depth: {session['depth']}",
        f"input_id: {input_id}",
        f"turn_id: {run.turn_id}",
        f"run_id: {run.run_id}",
    ]
    if role == "child":
        lines.append("You are a member session: deliver the task you were given first, then answer with its result.")
    return "\n".join(lines)


# What a model reads for a call of an ended Turn that was never answered (the Turn was cancelled
# or stopped, or gave up, between its reply and the call's result).
UNANSWERED_CALL = json.dumps({"error": "not run: its turn ended before this call ran"})


def _tool_result_text(outcome: Any) -> str:
    """A tool's outcome as the text stored and sent back to the model: not ASCII-escaped, which
    made each character of most scripts 6 (U+FFFD of a binary file's bytes too) and put a capped
    read or output at several times its cap; with each control character as its picture (JSON's
    escape is 6 characters) and U+FFFD for a lone surrogate, which PostgreSQL cannot store."""
    return storable(json.dumps(_pictured(outcome), default=str, ensure_ascii=False))


def _pictured(value: Any) -> Any:
    """``value`` with :func:`pictured` text in each of its strings, keys too."""
    if isinstance(value, str):
        return pictured(value)
    if isinstance(value, dict):
        return {_pictured(key): _pictured(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_pictured(item) for item in value]
    return value


def model_messages(history: list[Row], turn_id: uuid.UUID) -> list[dict[str, Any]]:
    """The history as the model's messages. A provider refuses a request in which a tool call has no
    result before the next message (OpenAI and Anthropic both do), so each unanswered call of an
    earlier Turn is answered here with UNANSWERED_CALL; nothing is stored, so a replay reads the
    same. The current Turn's calls are all answered before its next model call."""
    out: list[dict[str, Any]] = []
    unanswered: dict[str, None] = {}  # the calls of the last assistant message still without a result
    for row in history:
        if row["role"] == "tool":
            unanswered.pop(row["tool_call_id"], None)
        elif unanswered:
            out.extend({"role": "tool", "tool_call_id": call_id, "content": UNANSWERED_CALL} for call_id in unanswered)
            unanswered = {}
        message = to_model_message(row)
        if row["role"] == "assistant" and row["turn_id"] != turn_id:
            unanswered = dict.fromkeys(call["id"] for call in message["tool_calls"])
        out.append(message)
    return out


def to_model_message(row: Row) -> dict[str, Any]:
    if row["role"] == "assistant":
        return {"role": "assistant", "content": row["content"], "tool_calls": row["tool_calls"] or []}
    if row["role"] == "tool":
        return {"role": "tool", "tool_call_id": row["tool_call_id"], "content": messages.model_text(row)}
    return {"role": "user", "content": messages.model_text(row)}


@dataclasses.dataclass(frozen=True)
class _Call:
    """One tool call of the model, parsed: its tool and arguments, or the error to answer."""

    call: dict[str, Any]
    tool: Tool | SandboxTool | None
    args: Any
    error: dict[str, Any] | None = None


def _parse(call: dict[str, Any], allowed: frozenset[str]) -> _Call:
    try:
        tool, args = parse_args(call["name"], call.get("arguments") or {}, allowed)
    except CanopyError as error:
        return _Call(call, None, None, {"error": str(error)})
    return _Call(call, tool, args)


# A renamed id's stem leaves room for "_" and seven digits of suffix within an id's 64 characters.
_ID_STEM_CHARS = IDENTIFIER_CHARS - 8


def _parse_reply(calls: list[dict[str, Any]], allowed: frozenset[str], limit: int) -> list[_Call]:
    """A reply's calls, parsed. A reply with more than ``limit`` calls runs none of them (a model that
    floods tool calls is refused, not half-obeyed): its first ``limit`` are kept, each answered with
    the same error, and the rest dropped, so a flood costs the history ``limit`` answers, not one per
    call, sent back at every later model call."""
    if len(calls) > limit:
        error = {"error": f"this reply made {len(calls)} tool calls; the limit is {limit} per reply "
                          f"(setting CANOPY_MAX_TOOL_CALLS_PER_REPLY), so none of them ran: make at most {limit}"}
        return [_Call(call, None, None, error) for call in calls[:limit]]
    return [_parse(call, allowed) for call in calls]


def _with_unique_ids(calls: list[dict[str, Any]], taken: set[str]) -> list[dict[str, Any]]:
    """A reply's calls, each with an id no other call of the history sent has (``taken``: their ids
    so far). A call is known by its id (its receipt, its answer, its wait), and providers do not all
    keep ids unique: some OpenAI-compatible servers number calls per reply ("call_0" in each), a
    hostile one repeats an id or sends none. An empty id becomes "call"; a taken one becomes its stem
    (the id, cut to leave room for a suffix) with "_2", "_3", ... (the gateway has made every id at
    most 64 of ``[A-Za-z0-9_-]``, and so stays this). Done once, before the reply is committed:
    replays read the stored ids. Each stem's search goes on from the last suffix it gave, so however
    a reply repeats ids, or sends thousands of long ones that share a stem, it takes linear time."""
    renamed = []
    next_suffix: dict[str, int] = {}
    for call in calls:
        call_id = base = call.get("id") or "call"
        if call_id in taken:
            stem = base[:_ID_STEM_CHARS]
            n = next_suffix.get(stem, 2)
            while (call_id := f"{stem}_{n}") in taken:
                n += 1
            next_suffix[stem] = n + 1
        taken.add(call_id)
        renamed.append({**call, "id": call_id})
    return renamed


def _acts(item: _Call) -> bool:
    """Whether the call acts beyond the calling Run (its reply is then committed before it runs)."""
    return isinstance(item.tool, SandboxTool) or (isinstance(item.tool, Tool) and item.tool.acts)


def _batches(calls: list[_Call]) -> list[list[_Call]]:
    """Consecutive calls that only touch the database share a transaction; a sandbox call (which
    runs outside any transaction) is a batch of its own."""
    batches: list[list[_Call]] = []
    for item in calls:
        alone = isinstance(item.tool, SandboxTool)
        if batches and not alone and not isinstance(batches[-1][0].tool, SandboxTool):
            batches[-1].append(item)
        else:
            batches.append([item])
    return batches


async def _guarded(call: dict[str, Any], running: Awaitable[ToolResult]) -> ToolResult:
    """A tool's outcome, with its refusal (or an unexpected failure) as an error for the model."""
    with tracing.span("tool call", tool=tool_label(call.get("name")), tool_call_id=str(call.get("id"))[:64]):
        try:
            outcome = await running
        except (LeaseLost, TurnCancelled, asyncio.CancelledError):
            raise
        except CanopyError as error:
            outcome = {"error": str(error), **error.details}
        except Exception as error:
            log.exception("tool %s failed", call.get("name"))
            outcome = {"error": f"internal error in {call.get('name')}: {error}"}
    return outcome


async def _in_savepoint(conn: Connection, tool: Tool, ctx: ToolContext, call_id: str, args: Any) -> ToolResult:
    """Run a cooperation tool in a savepoint of the result's transaction: a call that is refused or
    fails changes nothing and holds no lock it took (a wait refused as a deadlock held the scope's
    wait lock to the step's commit, stalling every wait of the user meanwhile, and a session acting
    on this one could deadlock with it), and its error is still committed as the result, so is a
    deadlock with another session's step (a Conflict). A read's database error is its own error,
    not the Run's."""
    try:
        async with savepoint(conn):
            return await tool.handler(ctx, conn, call_id, args)
    except LockConflict:
        # Two sessions acting on each other at once (a submit_input or cancel_turn each way, or a
        # wait beside them): each step holds its own session's row and waits for the other's. One is
        # refused, and its step commits, which lets the other go on.
        raise Conflict(f"{tool.name}: the session it acts on was busy acting on this one at the same moment; "
                       "nothing was done, call it again") from None


def turn_tools(session: Row, granted: list[str] | None) -> frozenset[str]:
    """The Turn's tools: its session's, and of those only ``granted``, the ones the Turn that gave its
    input has too (``cooperation._origin``; None: the input came from no Turn): work a Turn hands on
    never runs a tool that Turn may not."""
    tools = effective_tools(session["agent_config"].get("tools"))
    return tools & frozenset(granted) if granted is not None else tools


def _last_reply(history: list[Row], turn_id: uuid.UUID) -> Row | None:
    return next((row for row in reversed(history) if row["turn_id"] == turn_id and row["role"] == "assistant"), None)


def unanswered_calls(history: list[Row], turn_id: uuid.UUID) -> list[dict[str, Any]]:
    """Tool calls of the Turn's last assistant message that have no committed result yet."""
    last_assistant = _last_reply(history, turn_id)
    if last_assistant is None:
        return []
    answered = {row["tool_call_id"] for row in history if row["turn_id"] == turn_id and row["role"] == "tool"}
    return [call for call in last_assistant["tool_calls"] or [] if call["id"] not in answered]


@dataclasses.dataclass(frozen=True)
class _Boundary:
    """A model boundary, taken: the Turn is being cancelled instead, or whether someone watches
    the tree's live text (then the model call is streamed), and the budget limit reached if any
    (then no model call starts: the tree is stopped)."""

    cancelling: bool
    watched: bool = False
    over_budget: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class _Begun:
    """What a Run's first transaction read: its session, its Turn's input, the boundary taken."""

    session: Row
    turn_input: TurnInput
    boundary: _Boundary | None
    over_budget: dict[str, Any] | None = None  # checked at every Run's start, before any tool runs


class RunExecutor:
    """Executes one leased Run inside a SessionActor.

    The history is read once when the Run starts and then kept in memory: within a Run only
    this Run writes the session's history (fenced by its lease), and every row it inserts is
    handed back and added at once, so the copy is exactly what a re-read would find (a
    transaction that fails ends the Run, so the copy never outlives a rollback).

    Transactions per model step: one or two. A reply whose calls act on other sessions
    (create, submit, message, cancel, sandbox commands) is committed first, with its usage;
    then its calls run and their results are committed together — a crash in between finds
    the calls unanswered and runs them then, under their receipts. A reply whose calls only
    read or wait is committed in the same transaction as their results (nothing in it could
    happen twice). The next model boundary (cancellation check, messages and steers,
    watchers) rides on the last commit, and a final answer ends the Turn in its own commit.
    """

    def __init__(self, db: Database, settings: Settings, placement: Placement, run: RunRef, *,
                 heartbeats: Heartbeats, go_on: Callable[[], bool]) -> None:
        self.db = db
        self.settings = settings
        self.placement = placement
        self.run = run
        self._heartbeats = heartbeats
        self._go_on = go_on  # asked at each model boundary: False hands the Run back (_hand_back)
        self._history: list[Row] = []
        self._begun: _Begun | None = None
        self._tools: frozenset[str] = frozenset()
        self._compact_requested = False  # read at each model boundary
        self._compaction_refused_until: int | None = None  # read at each model boundary (_compact_if_due)
        # A summary call of this Run failed for a reason that passes: the next Run asks again, not the next call.
        self._compaction_passed = False
        self._session_name = ""

    async def execute(self) -> None:
        main = asyncio.current_task()
        assert main is not None
        # Its lease lost, or its Turn being cancelled: the Run stops at once.
        self._heartbeats.hold(self.run, main.cancel)
        try:
            async with tracing.run_span(self.db, self.run):
                await self._execute()
        except asyncio.CancelledError:
            await asyncio.shield(self._end_if_cancelling())
            raise
        except LeaseLost:
            log.info("run %s lost its lease; stopping without further writes", self.run.run_id)
        except TurnCancelled:
            await self._finish(TurnStatus.CANCELLED)  # the cancel's reason (turns.finish_turn)
        finally:
            self._heartbeats.release(self.run)

    async def begin(self, conn: Connection, acquired: run_repo.AcquiredRun | None = None) -> None:
        """The Run's first reads, in the caller's transaction (the one that acquired the Run, whose
        statement read the session and the Turn's input too): a resumed wait's outcome is
        committed, the session, the Turn's input and the history are read, and when the model
        is called next its boundary is taken too."""
        if self.run.kind == RunKind.RESUME:  # only a resume Run can continue a wait
            await self._deliver_wait_outcome(conn)
        if acquired is not None:
            session, turn_input = acquired.session, acquired.turn_input
        else:
            session, turn_input = await session_and_turn_input(conn, self.run)
        self._history = await messages.model_history(conn, self.run.session_id)
        boundary = await self._take_boundary(conn) if self._model_is_next() else None
        over_budget = boundary.over_budget if boundary else await usage.budget_reached(conn, self.run.tree_id)
        self._begun = _Begun(session, turn_input, boundary, over_budget)

    def _final_reply(self) -> Row | None:
        """The Turn's committed answer: its last message is an assistant reply without tool calls."""
        last = self._history[-1] if self._history else None
        if last and last["role"] == "assistant" and last["turn_id"] == self.run.turn_id and not last["tool_calls"]:
            return last
        return None

    def _model_is_next(self) -> bool:
        return not unanswered_calls(self._history, self.run.turn_id) and self._final_reply() is None

    async def _execute(self) -> None:
        if self._begun is None:  # not begun with the acquisition: begin in a transaction of its own
            async with self.db.tx() as conn:
                await self.begin(conn)
        assert self._begun is not None
        session, input_id, boundary = self._begun.session, self._begun.turn_input.input_id, self._begun.boundary
        self._tools = turn_tools(session, self._begun.turn_input.granted)
        self._session_name = session["name"]
        if self._begun.over_budget is not None and await self._stop_for_budget():
            return
        while True:
            pending = unanswered_calls(self._history, self.run.turn_id)
            if pending:
                parked, boundary = await self._run_tools(session, input_id, pending)
                if parked:
                    return  # this Run is interrupted
                continue
            final = self._final_reply()
            if final is not None:
                # A resumed Run whose answer was committed by an incarnation that then died.
                await self._finish(TurnStatus.COMPLETED, output=final["content"] or "")
                return
            if boundary is None:
                async with self.db.tx() as conn:
                    boundary = await self._take_boundary(conn)
            if boundary.cancelling:
                await self._finish(TurnStatus.CANCELLED)  # the cancel's reason (turns.finish_turn)
                return
            if boundary.over_budget is not None:
                if await self._stop_for_budget():
                    return
                boundary = None  # the budget was raised meanwhile: take the boundary again
                continue
            if self._model_calls() >= self.settings.max_model_calls_per_turn:
                await self._finish(TurnStatus.FAILED,
                                   error=f"the turn made {self._model_calls()} model calls, the limit per "
                                   "turn (setting CANOPY_MAX_MODEL_CALLS_PER_TURN); it was stopped")
                return
            if not self._go_on():
                await self._hand_back()
                return
            await failpoints.pause("before_model_call", session["name"])
            reply = await self._call_model(session, input_id, stream=boundary.watched)
            boundary = None
            if reply is None:
                return  # the call failed for good: the Turn has failed
            reply["message"]["tool_calls"] = _with_unique_ids(reply["message"]["tool_calls"], self._call_ids())
            calls = _parse_reply(reply["message"]["tool_calls"], self._tools, self.settings.max_tool_calls_per_reply)
            reply["message"]["tool_calls"] = [item.call for item in calls]  # a flood's kept calls only
            if calls and not any(_acts(call) for call in calls):
                # Only reads and waits: the reply is committed with their results (see _run_batch).
                parked, boundary = await self._run_batch(session, input_id, calls, model_is_next=True, reply=reply)
                if parked:
                    return
                continue
            if await self._commit_reply(reply):
                return  # the reply was the answer: the Turn has ended
            await failpoints.pause("after_model_commit", session["name"])

    async def _hand_back(self) -> None:
        """Stop at a model boundary and leave the Run, still granted, to the session's next
        incarnation (its host moves to another node): every step so far is committed, so that
        incarnation goes on from the history as a resumed Run does, and a drain waits one model
        step at most instead of the whole Run."""
        # Unowned, the Run waits for the rest of the drain (another session's step may hold the host
        # up to its limit) and then for an acquisition; the sweep recovers it only past both.
        async with self.db.tx() as conn:
            await run_repo.hand_back(conn, self.run, self.settings.drain_hold_seconds)
        self._ended()

    def _call_ids(self) -> set[str]:
        """The ids of the tool calls of the history the model is sent, every Turn's (the history holds
        all of this Turn's messages): within a Turn a call is known by its id, and a provider such as
        Anthropic refuses a request that repeats one anywhere, as a server that numbers calls per
        reply ("call_0" in each Turn) would make it."""
        return {call["id"] for row in self._history if row["role"] == "assistant" for call in row["tool_calls"] or []}

    def _model_calls(self) -> int:
        """The Turn's model calls so far: its committed replies, read from the history (durable,
        so a Run that resumes after a crash counts the calls of the Runs before it)."""
        return sum(1 for row in self._history if row["turn_id"] == self.run.turn_id and row["role"] == "assistant")

    async def _take_boundary(self, conn: Connection) -> _Boundary:
        """Take messages and steers into the history, unless the Turn is being cancelled (or
        stopped): then the caller ends it as cancelled instead of calling the model."""
        boundary = await messages.take_boundary(conn, self.run)
        self._compact_requested = boundary.compact_requested
        self._compaction_refused_until = boundary.compaction_refused_until
        if boundary.turn_status == TurnStatus.CANCELLING:
            return _Boundary(cancelling=True)
        self._history.extend(boundary.taken)
        return _Boundary(cancelling=False, watched=boundary.watched, over_budget=boundary.budget_reached)

    async def _stop_for_budget(self) -> bool:
        """The tree's budget is used up: stop the tree (see actors/budgets.py) and end this Turn as
        cancelled, as the stop cancelled it. False when a raised budget left room meanwhile."""
        if not await budgets.stop_tree(self.placement, self.db, self.run):
            return False
        await self._finish(TurnStatus.CANCELLED)  # the stop's reason, with the limit (turns.finish_turn)
        return True

    async def _call_model(self, session: Row, input_id: uuid.UUID, *, stream: bool) -> dict[str, Any] | None:
        """The gateway's reply, or None when the call failed for good (the Turn has failed)."""
        config = session["agent_config"]
        system = "\n\n".join([config.get("instructions") or DEFAULT_INSTRUCTIONS,
                               identity_block(session, self.run, input_id)])
        request = [{"role": "system", "content": system}, *model_messages(self._history, self.run.turn_id)]
        # The step names this call within its Turn: a page keeps each call's text apart by it, however
        # the stream orders this call's deltas and the previous call's message (frontend/js/store.js).
        watch = {"session_id": str(self.run.session_id), "tree_id": str(self.run.tree_id),
                 "turn_id": str(self.run.turn_id), "step": self._model_calls()}
        try:
            await self._compact_if_due(config, request)
            if self._history[:1] and messages.is_summary(self._history[0]):
                request = [request[0], *model_messages(self._history, self.run.turn_id)]
            return await gateways.complete_for_run(run_id=str(self.run.run_id), **self._endpoint(config),
                                                    messages=request, tools=schemas(self._tools),
                                                    watch=watch if stream else None, **tracing.carrier())
        except (LeaseLost, asyncio.CancelledError, DatabaseError):
            raise  # a database error is this Run's, not the model's: the Run is recovered, the Turn goes on
        except Exception as error:
            cause, charged = _model_failure(error)
            # A reply generated but not kept (past the size limit) was billed: a budget counts it.
            await self._finish(TurnStatus.FAILED, error=f"model call failed: {cause}", charged=charged)
            return None

    def _model(self, config: dict[str, Any]) -> str:
        return str(config.get("model") or self.settings.default_model)

    def _endpoint(self, config: dict[str, Any]) -> dict[str, Any]:
        """Where the agent's calls go: its model, with its own api_base and key name (None: the defaults)."""
        return {"model": self._model(config), "api_base": config.get("api_base"),
                "api_key_ref": config.get("api_key_ref")}

    async def _compact_if_due(self, config: dict[str, Any], request: list[dict[str, Any]]) -> None:
        """Before a model call: if it would send more tokens than the session's threshold (or a human
        asked), commit a summary of the messages before this Turn, which stands for them from now on
        (actors/compaction.py). The history in memory becomes the summary and this Turn's messages.
        A summary is an economy, not the user's work: one that fails or cannot be used leaves the
        history as it is, and the call goes on with it (the call itself fails if it is too long); it
        is recorded, and not asked for again until the history has grown (``compaction.grown_since``)
        or a human asks, unless its call failed for a reason that passes (``compaction.passing``): then
        the next Run asks again (the next Turn, or this one's after a wait), not every call of this one."""
        earlier = compaction.earlier_messages(self._history, self.run.turn_id)
        already = len(earlier) == 1 and messages.is_summary(earlier[0])
        if not earlier or already or self._compaction_passed:
            return
        threshold = int(config.get("compact_at_tokens") or self.settings.compact_at_tokens)
        refused = self._compaction_refused_until
        if not self._compact_requested and refused is not None and not compaction.grown_since(
                earlier, refused, threshold):
            return
        count = functools.partial(self._counted, config, tools=None)  # the model's own count of a request
        try:
            if not self._compact_requested and not await self._over_threshold(config, request, threshold):
                return
            summarising = await compaction.fitted_request(earlier, threshold, count)
            reply = await gateways.complete_for_run(run_id=str(self.run.run_id), **self._endpoint(config),
                                                     messages=summarising, tools=None, watch=None)
        except (LeaseLost, asyncio.CancelledError, DatabaseError):
            raise
        except Exception as error:
            cause, charged = _model_failure(error)
            passing = self._compaction_passed = compaction.passing(cause)
            log.warning("run %s: compacting %d messages failed (%s); the history is kept%s",
                        self.run.run_id, len(earlier), cause, ", and asked again by the next Run" if passing else "")
            await self._keep_history(earlier, charged=charged, refused=not passing)  # billed, if generated
            return
        await failpoints.pause("during_compaction", self._session_name)
        text = reply["message"]["content"] or ""
        if not await compaction.usable(text, threshold, model_messages(earlier, self.run.turn_id), count):
            log.warning("run %s: a summary of %d characters cannot stand for %d messages; the history is kept",
                        self.run.run_id, len(text), len(earlier))
            await self._keep_history(earlier, charged=reply)  # not used, but billed: a budget counts it
            return
        async with self.db.tx() as conn:
            if self._compact_requested or refused is not None:
                await messages.compaction_asked(conn, self.run.session_id, refused_until=None)
            summary = await messages.append_summary(
                conn, self.run, summary=text, covers_until=earlier[-1]["id"], covered=len(earlier),
                usage=reply["usage"], cost_usd=reply["cost_usd"])
        self._compact_requested, self._compaction_refused_until = False, None
        self._history = [summary, *self._history[len(earlier):]]

    async def _over_threshold(self, config: dict[str, Any], request: list[dict[str, Any]], threshold: int) -> bool:
        """Whether the call would send more than ``threshold`` tokens. The exact count is asked only
        when the cheap estimate comes near it; a count that fails counts as under (the call goes on)."""
        tools = schemas(self._tools)
        if compaction.estimate_tokens(request, tools) < threshold // 2:
            return False
        counted = await self._counted(config, request, tools)
        return counted is not None and counted > threshold

    async def _counted(self, config: dict[str, Any], request: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None) -> int | None:
        """The request's prompt tokens by the model's tokenizer (in the gateway); None when they
        cannot be counted (the caller goes on without)."""
        try:
            return int(await gateways.call("count_tokens", model=self._model(config), messages=request, tools=tools))
        except (asyncio.CancelledError, DatabaseError):
            raise
        except Exception:
            log.exception("run %s: counting the request's tokens failed", self.run.run_id)
            return None

    async def _keep_history(self, earlier: list[Row], *, charged: dict[str, Any] | None,
                            refused: bool = True) -> None:
        """No summary of ``earlier`` this time (its call failed, or its text cannot stand for the
        history): count a call the provider billed (``charged``: its usage and cost), and record the
        refusal, which serves a human's request too (see ``_compact_if_due``). A call that failed for
        a reason that passes is no refusal (``refused`` False): nothing is recorded but its charge,
        and the next model boundary asks again, for a human's request too."""
        if not refused and charged is None:
            return
        async with self.db.tx() as conn:
            if refused:
                # A human's request that came while the summary was being made stays for the next boundary.
                await messages.compaction_asked(conn, self.run.session_id, refused_until=earlier[-1]["id"],
                                                served=self._compact_requested)
            if charged is not None:
                await messages.charge_call(conn, self.run, usage=charged["usage"], cost_usd=charged["cost_usd"])
            else:
                await run_repo.fence(conn, self.run)
        if refused:
            self._compact_requested, self._compaction_refused_until = False, earlier[-1]["id"]

    async def _commit_reply(self, reply: dict[str, Any]) -> bool:
        """Commit the reply with the call's usage. A reply without tool calls is the answer: the
        Turn ends in the same commit, and True is returned."""
        message = reply["message"]
        final = not message["tool_calls"]
        hints = signals.NO_HINTS
        async with self.db.tx() as conn:
            # finish_turn's lock order: the session before the Run (which the reply's charge locks)
            session = await turns.lock_session(conn, self.run.scope, self.run.session_id) if final else None
            await self._append_reply(conn, reply)
            if final:
                await turns.finish_turn(conn, self.run, TurnStatus.COMPLETED, output=message["content"] or "",
                                        locked_session=session)
                hints = await signals.change_hints(conn, [self.run.session_id], hand_off_tree=self.run.tree_id)
        if final:
            self._ended()
        await signals.send_hints(self.placement, self.db, hints)  # the freed slot, the waiters on this answer
        if final:
            tracing.turn_ended(TurnStatus.COMPLETED)
        return final

    async def _append_reply(self, conn: Connection, reply: dict[str, Any]) -> None:
        """The reply joins the history with the call's usage (fenced)."""
        message = reply["message"]
        self._history.append(await messages.append_reply(
            conn, self.run, content=message["content"], tool_calls=message["tool_calls"] or None,
            usage=reply["usage"], cost_usd=reply["cost_usd"]))

    async def _run_tools(self, session: Row, input_id: uuid.UUID, calls: list[dict[str, Any]]
                         ) -> tuple[bool, _Boundary | None]:
        """Execute unanswered calls in order: (True, None) when one of them parked the Turn, else
        (False, the model boundary taken with the last result's commit)."""
        last = _last_reply(self._history, self.run.turn_id)
        assert last is not None
        every_call = last["tool_calls"] or []
        # The limit held when the reply was committed (a flood keeps none to run): a lower one set
        # since must not refuse calls of a reply that some have run already.
        limit = max(self.settings.max_tool_calls_per_reply, len(every_call))
        parsed = {item.call["id"]: item for item in _parse_reply(every_call, self._tools, limit)}
        batches = _batches([parsed[call["id"]] for call in calls])
        boundary = None
        for position, batch in enumerate(batches):
            parked, boundary = await self._run_batch(session, input_id, batch,
                                                     model_is_next=position == len(batches) - 1)
            if parked:
                return True, None
        return False, boundary

    async def _run_batch(self, session: Row, input_id: uuid.UUID, batch: list[_Call], *, model_is_next: bool,
                         reply: dict[str, Any] | None = None) -> tuple[bool, _Boundary | None]:
        """Run calls and commit their results in one transaction, then send the hints: (whether a
        call parked the Turn, the model boundary when the model is called next).

        Every tool, reads too, runs only under a live lease: the commit is fenced. Cooperation
        tools run inside it (see ``_in_savepoint``); a sandbox tool (a batch of its own) runs
        first, outside any transaction. A call that parks ends the batch: the calls after it
        run when the Turn resumes. With ``reply`` (calls that only read or wait) the reply that
        made the calls is committed in the same transaction, first: a crash before the commit
        asks the model again, and nothing was done that could be done twice.
        """
        ctx = ToolContext(db=self.db, settings=self.settings, run=self.run, session=session, input_id=input_id)
        outcome: ToolResult | None = None
        sandbox = batch[0].tool
        if isinstance(sandbox, SandboxTool):
            async with self.db.tx() as conn:  # no command starts under a lost lease or for a cancelled Turn
                ctx.dispatcher = await self._dispatcher(conn)
            outcome = await _guarded(batch[0].call, sandbox.handler(ctx, batch[0].call["id"], batch[0].args))
        boundary = wait_id = None
        parked = False
        async with self.db.tx() as conn:
            if reply is not None:
                await self._append_reply(conn, reply)
            ctx.dispatcher = await self._dispatcher(conn)
            results: list[tuple[str, str]] = []
            park: tuple[str, Park] | None = None
            for item in batch:
                refused = False
                if isinstance(item.tool, Tool):
                    outcome = await _guarded(item.call, _in_savepoint(conn, item.tool, ctx, item.call["id"], item.args))
                elif item.error is not None:
                    outcome, refused = item.error, True
                assert outcome is not None  # a sandbox call's ran before the transaction
                count_tool_call(conn, item.call.get("name"), outcome, refused=refused)
                if isinstance(outcome, Park):
                    park = item.call["id"], outcome
                    break
                results.append((item.call["id"], _tool_result_text(outcome)))
            self._history.extend(await messages.append_tool_results(conn, self.run, results))
            if isinstance(sandbox, SandboxTool):
                await sandbox_tools.record_told(conn, self.run, outcome)
            if park is not None:
                parked, wait_id = True, await self._park(conn, *park)
            if model_is_next and not parked:
                boundary = await self._take_boundary(conn)
            # A park released this Run's slot: hand it on in the same commit. It also changed this
            # session's state (waiting, for a human perhaps), which wait_sessions waiters watch.
            touched = [*ctx.touched_sessions, self.run.session_id] if wait_id else ctx.touched_sessions
            hints = await signals.change_hints(conn, touched, hand_off_tree=self.run.tree_id if wait_id else None)
        if wait_id is not None:
            self._ended()
        await asyncio.gather(*(self.placement.activate(s) for s in ctx.signalled_sessions))
        ctx.signalled_sessions.clear()
        ctx.touched_sessions.clear()
        await signals.send_hints(self.placement, self.db, hints)
        if parked:
            await self._after_park(wait_id)
        return parked, boundary

    async def _dispatcher(self, conn: Connection) -> Dispatcher:
        """A tool step begins (``turns.begin_tool_step``: fenced, serialised with a cancel of the
        Turn, TurnCancelled if one came first); what the step's calls pass on to the work they cause."""
        return Dispatcher(await turns.begin_tool_step(conn, self.run), self._tools)

    async def _park(self, conn: Connection, call_id: str, park: Park) -> uuid.UUID | None:
        """Interrupt the Run into a wait; None when the Turn is being cancelled instead."""
        try:
            return await waits.park(conn, self.run, tool_call_id=call_id, kind=park.kind,
                                    condition=park.condition, timeout_seconds=park.timeout_seconds,
                                    targets=park.targets, request_payload=park.request_payload)
        except Conflict:  # raised before the wait writes anything
            return None

    async def _after_park(self, wait_id: uuid.UUID | None) -> None:
        if wait_id is None:  # the Turn is being cancelled: it ends instead of waiting
            await self._finish(TurnStatus.CANCELLED)  # the cancel's reason (turns.finish_turn)
            return
        # The condition may have been met between our check and the commit: re-check now.
        await signals.resume_wait(self.placement, self.db, wait_id)

    async def _deliver_wait_outcome(self, conn: Connection) -> None:
        """A Run that resumes a wait first commits the wait's outcome as the waiting call's result."""
        wait = await waits.resumed_wait(conn, self.run.turn_id)
        if wait is None:
            return
        if await messages.has_tool_result(conn, self.run.turn_id, wait["tool_call_id"]):
            return
        await run_repo.fence(conn, self.run)
        if wait["kind"] == WaitKind.APPROVAL:
            return  # the call runs again and reads the decision (sandbox_tools.run_command)
        outcome = await waits.wait_outcome(conn, self.run.scope, wait, self.run.session_id, self.run.turn_id)
        await messages.append_tool_results(conn, self.run, [(wait["tool_call_id"], _tool_result_text(outcome))])

    async def _finish(self, status: str, *, output: str | None = None, error: str | None = None,
                      charged: dict[str, Any] | None = None) -> None:
        """End the Turn; ``charged``: a model call's usage to count on the Run first, in the same commit."""
        async with self.db.tx() as conn:
            if charged is not None:
                await messages.charge_call(conn, self.run, usage=charged["usage"], cost_usd=charged["cost_usd"])
            await turns.finish_turn(conn, self.run, status, output=output, error=error)
            hints = await signals.change_hints(conn, [self.run.session_id], hand_off_tree=self.run.tree_id)
        self._ended()
        await signals.send_hints(self.placement, self.db, hints)
        tracing.turn_ended(status)

    def _ended(self) -> None:
        """The Run's end (or its handing back) is committed: no beat may take it for lost now and
        cancel what is left (its hints, its span)."""
        self._heartbeats.release(self.run)

    async def _end_if_cancelling(self) -> None:
        """The Run's task was cancelled: if its Turn is being cancelled, record the end."""
        with contextlib.suppress(LeaseLost):
            async with self.db.tx() as conn:
                status = await turns.turn_status(conn, self.run.turn_id)
            if status == TurnStatus.CANCELLING:
                await self._finish(TurnStatus.CANCELLED)  # the cancel's reason (turns.finish_turn)


def _model_failure(error: Exception) -> tuple[BaseException, dict[str, Any] | None]:
    """A failed model call's cause (through Ray, ModelError arrives wrapped; its text is the
    provider's) and what the provider billed for it, if anything."""
    cause = getattr(error, "cause", None) or error
    return cause, getattr(cause, "charged", None)
