"""The built-in scripted model (SPEC §13): an OpenAI-compatible endpoint for offline runs.

Canopy reaches it through litellm exactly like a real provider (``canopy/scripted`` is
routed to ``openai/scripted`` with this server as ``api_base``), so tests, demos and
benchmarks exercise the real model path without a network.

Behaviour, decided only from the request messages so that it is deterministic and a
replayed Run gets the same answers:

* The Turn's Input is the last ``user`` message that is not a Canopy injection
  (``<canopy:message ...>`` / ``<canopy:steer>``); the step index is the number of
  ``assistant`` messages after it.
* If the Input has a line ``#!script`` followed by a JSON list, element ``step`` is the reply:
  ``{"call": [{"name", "args"}, ...]}``, ``{"say": text}`` or ``{"fail": text}``, each with an
  optional ``delay_ms``: the latency from the request's arrival to the reply's start, this
  model's own work included (as in a real provider's latency). A streamed reply may also take
  ``stream_ms``, spread evenly between its chunks, as a real model's text arrives over time
  (an extension of SPEC §13, which leaves streaming pace open). Past the end of the list the
  model says :data:`FINAL_TEXT`.
* Strings inside ``args``/``say`` may reference tool results of this Turn as
  ``${N.dotted.path}``; ``${N}`` is the whole result as JSON text. A string that is exactly
  one reference takes the referenced value's type. ``$${...}`` stands for a literal ``${...}``
  (a nested script handed to a child keeps its own references).
* Without a script it runs the demo: a root fans out to two or three children with
  ``create_session``, waits with ``wait_inputs`` and summarises; a child answers its task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODEL_ID = "scripted"
FINAL_TEXT = "script finished"
SCRIPT_MARKER = "#!script"
CANOPY_PREFIX = "<canopy:"

# ``$${...}`` escapes a reference, e.g. inside a nested script meant for a child session.
_REFERENCE = re.compile(r"(\$?)\$\{(\d+)((?:\.[^.{}]+)*)\}")
_ROLE_LINE = re.compile(r"^\s*[-*]?\s*role\s*:\s*(root|child)\s*$", re.IGNORECASE | re.MULTILINE)
_NAME_LINE = re.compile(r"^\s*[-*]?\s*name\s*:\s*(\S.*?)\s*$", re.IGNORECASE | re.MULTILINE)
_DEMO_CHILDREN = (
    ("research", "Research the background and key facts needed for this task: {task}"),
    ("draft", "Draft a direct answer to this task: {task}"),
    ("review", "Review the likely pitfalls and open questions of this task: {task}"),
)
# Short tasks get two children, longer ones three: deterministic and visibly task-dependent.
_THREE_CHILDREN_MIN_WORDS = 8
_TASK_QUOTE_LIMIT = 200


class ScriptError(Exception):
    """The request cannot be answered as scripted; reported to the caller as HTTP 400."""


# ---------------------------------------------------------------------------
# Reading the request
# ---------------------------------------------------------------------------


def content_text(content: Any) -> str:
    """Plain text of an OpenAI message content (a string or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(str(p) for p in parts)
    return str(content)


@dataclass
class TurnView:
    """What the scripted model knows about the current Turn, derived from the messages."""

    input_index: int
    input_text: str
    step: int
    system_text: str
    tool_names: frozenset[str] | None
    call_ids: list[str] = field(default_factory=list)
    call_names: list[str] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        # Ties tool call ids to this Input so that ids stay unique across the Turns of a
        # session yet are identical when a Run is replayed from the same history.
        digest = hashlib.sha1(f"{self.input_index}:{self.input_text}".encode()).hexdigest()
        return digest[:8]

    def raw_result(self, index: int) -> str:
        if index >= len(self.call_ids):
            raise ScriptError(
                f"reference to tool call {index}, but this Turn has only {len(self.call_ids)} tool call(s)"
            )
        call_id = self.call_ids[index]
        if call_id not in self.results:
            raise ScriptError(f"reference to tool call {index} ({call_id}), which has no tool result yet")
        return self.results[call_id]

    def result(self, index: int) -> Any:
        raw = self.raw_result(index)
        try:
            return json.loads(raw)
        except ValueError:
            return raw


def _is_input(message: dict[str, Any]) -> bool:
    if message.get("role") != "user":
        return False
    return not content_text(message.get("content")).lstrip().startswith(CANOPY_PREFIX)


def _tool_names(tools: list[dict[str, Any]] | None) -> frozenset[str] | None:
    if tools is None:
        return None
    names = {(t.get("function") or {}).get("name") or t.get("name") for t in tools if isinstance(t, dict)}
    return frozenset(n for n in names if n)


def read_turn(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> TurnView:
    input_index = next((i for i in range(len(messages) - 1, -1, -1) if _is_input(messages[i])), -1)
    system = next((m for m in messages if m.get("role") == "system"), None)
    turn = TurnView(
        input_index=input_index,
        input_text=content_text(messages[input_index].get("content")) if input_index >= 0 else "",
        step=0,
        system_text=content_text(system.get("content")) if system else "",
        tool_names=_tool_names(tools),
    )
    for message in messages[input_index + 1 :]:
        if message.get("role") == "assistant":
            turn.step += 1
            for call in message.get("tool_calls") or []:
                turn.call_ids.append(str(call.get("id")))
                turn.call_names.append(str((call.get("function") or {}).get("name", "")))
        elif message.get("role") == "tool":
            turn.results[str(message.get("tool_call_id"))] = content_text(message.get("content"))
    return turn


# ---------------------------------------------------------------------------
# Scripts
# ---------------------------------------------------------------------------


def parse_script(text: str) -> list[dict[str, Any]] | None:
    """The script embedded in an Input text, or None when the text has no ``#!script`` line."""
    lines = text.split("\n")
    marker = next((i for i, line in enumerate(lines) if line.strip() == SCRIPT_MARKER), None)
    if marker is None:
        return None
    body = "\n".join(lines[marker + 1 :])
    try:
        script = json.loads(body)
    except ValueError as exc:
        raise ScriptError(
            f"invalid script: the text after '{SCRIPT_MARKER}' is not valid JSON ({exc})"
        ) from exc
    if not isinstance(script, list):
        raise ScriptError(f"invalid script: expected a JSON list of steps, got {type(script).__name__}")
    for index, step in enumerate(script):
        _validate_step(index, step)
    return script


def _validate_step(index: int, step: Any) -> None:
    where = f"invalid script step {index}"
    if not isinstance(step, dict):
        raise ScriptError(f"{where}: expected an object, got {type(step).__name__}")
    kinds = [k for k in ("call", "say", "fail") if k in step]
    if len(kinds) != 1:
        raise ScriptError(f"{where}: needs exactly one of 'call', 'say', 'fail'")
    for key in ("delay_ms", "stream_ms"):
        value = step.get(key, 0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ScriptError(f"{where}: '{key}' must be a non-negative number")
    if kinds[0] == "call":
        calls = step["call"]
        if not isinstance(calls, list) or not calls:
            raise ScriptError(f"{where}: 'call' must be a non-empty list")
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ScriptError(f"{where}: every call needs a string 'name'")
            if not isinstance(call.get("args", {}), dict):
                raise ScriptError(f"{where}: 'args' of {call['name']} must be an object")
    elif not isinstance(step[kinds[0]], str):
        raise ScriptError(f"{where}: '{kinds[0]}' must be a string")


def _lookup(value: Any, path: list[str], reference: str) -> Any:
    for key in path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise ScriptError(f"reference {reference}: no '{key}' in {json.dumps(value)[:200]}")
    return value


def _reference_value(match: re.Match[str], turn: TurnView) -> Any:
    if match.group(1):
        return match.group(0)[1:]
    index = int(match.group(2))
    path = [p for p in match.group(3).split(".") if p]
    if not path:
        # The whole result "as JSON": the tool message text is that JSON already.
        return turn.raw_result(index)
    return _lookup(turn.result(index), path, match.group(0))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def resolve_references(value: Any, turn: TurnView) -> Any:
    """Replace ``${N.path}`` references inside every string of a JSON-like value."""
    if isinstance(value, dict):
        return {k: resolve_references(v, turn) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_references(v, turn) for v in value]
    if not isinstance(value, str):
        return value
    exact = _REFERENCE.fullmatch(value)
    if exact:
        return _reference_value(exact, turn)
    return _REFERENCE.sub(lambda m: _as_text(_reference_value(m, turn)), value)


# ---------------------------------------------------------------------------
# Replies
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One model response: text and/or OpenAI tool calls, or a provider failure."""

    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    fail: str | None = None
    delay_ms: float = 0
    stream_ms: float = 0


def _tool_call(turn: TurnView, position: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{turn.tag}_{turn.step}_{position}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _calls(turn: TurnView, calls: list[tuple[str, dict[str, Any]]], **timing: float) -> Reply:
    tool_calls = tuple(_tool_call(turn, i, name, args) for i, (name, args) in enumerate(calls))
    return Reply(tool_calls=tool_calls, **timing)


def _script_reply(script: list[dict[str, Any]], turn: TurnView) -> Reply:
    if turn.step >= len(script):
        return Reply(content=FINAL_TEXT)
    step = script[turn.step]
    timing = {key: float(step.get(key, 0)) for key in ("delay_ms", "stream_ms")}
    if "fail" in step:
        return Reply(fail=step["fail"], **timing)
    if "say" in step:
        return Reply(content=_as_text(resolve_references(step["say"], turn)), **timing)
    calls = [(c["name"], resolve_references(c.get("args", {}), turn)) for c in step["call"]]
    return _calls(turn, calls, **timing)


def _quote_task(task: str) -> str:
    task = " ".join(task.split())
    return task if len(task) <= _TASK_QUOTE_LIMIT else task[: _TASK_QUOTE_LIMIT - 1] + "…"


def _identity_value(pattern: re.Pattern[str], system_text: str) -> str | None:
    match = pattern.search(system_text)
    return match.group(1).strip() if match else None


def _demo_children(task: str) -> list[tuple[str, dict[str, Any]]]:
    count = 3 if len(task.split()) >= _THREE_CHILDREN_MIN_WORDS else 2
    quoted = _quote_task(task) or "the user's request"
    return [
        ("create_session", {"name": name, "description": template.format(task=quoted)})
        for name, template in _DEMO_CHILDREN[:count]
    ]


def _results_of(turn: TurnView, tool: str) -> list[Any]:
    """Results of every call to ``tool`` in this Turn that has one, in call order."""
    return [
        turn.result(index)
        for index, name in enumerate(turn.call_names)
        if name == tool and turn.call_ids[index] in turn.results
    ]


def _child_name(result: Any) -> str:
    return str(result.get("name", "?")) if isinstance(result, dict) else "?"


def _failure_summary(task: str, created: list[Any]) -> str:
    lines = [f"I could not delegate the task ({_quote_task(task)}):"]
    for position, result in enumerate(created):
        if isinstance(result, dict) and "error" not in result:
            lines.append(f"- child {position + 1} was created: {_child_name(result)}")
        else:
            error = result.get("error") if isinstance(result, dict) else result
            lines.append(f"- child {position + 1} failed: {error}")
    return "\n".join(lines)


def _demo_wait(turn: TurnView) -> Reply:
    created = _results_of(turn, "create_session")
    if not created or any(not isinstance(r, dict) or "error" in r for r in created):
        return Reply(content=_failure_summary(turn.input_text, created))
    return _calls(turn, [("wait_inputs", {"input_ids": [r.get("input_id") for r in created]})])


def _demo_summary(turn: TurnView) -> Reply:
    created = [r for r in _results_of(turn, "create_session") if isinstance(r, dict)]
    names = {r.get("input_id"): _child_name(r) for r in created}
    waits = _results_of(turn, "wait_inputs")
    waited = waits[-1] if waits else None
    lines = [f"Summary for: {_quote_task(turn.input_text)}"]
    if not isinstance(waited, dict) or not isinstance(waited.get("results"), list):
        lines.append(f"Waiting for the children failed: {_as_text(waited)}")
        return Reply(content="\n".join(lines))
    for result in waited["results"]:
        name = names.get(result.get("input_id"), result.get("session_id", "?"))
        if result.get("output") is not None:
            lines.append(f'- {name}: "{result["output"]}"')
        else:
            lines.append(f"- {name} ({result.get('status')}): {result.get('error') or 'no output'}")
    if waited.get("timed_out"):
        lines.append("(some children had not finished when the wait timed out)")
    return Reply(content="\n".join(lines))


def _demo_child(turn: TurnView) -> Reply:
    name = _identity_value(_NAME_LINE, turn.system_text) or "child"
    task = _quote_task(turn.input_text) or "no task given"
    return Reply(content=f"[{name}] Done. My answer to '{task}': it is handled, step by step.")


def _can_delegate(turn: TurnView) -> bool:
    if turn.tool_names is None:
        return False
    return {"create_session", "wait_inputs"} <= turn.tool_names


def _demo_reply(turn: TurnView) -> Reply:
    is_root = _identity_value(_ROLE_LINE, turn.system_text) == "root"
    if not (is_root and _can_delegate(turn)):
        return _demo_child(turn) if turn.step == 0 else Reply(content=FINAL_TEXT)
    if turn.step == 0:
        return _calls(turn, _demo_children(turn.input_text))
    if turn.step == 1:
        return _demo_wait(turn)
    if turn.step == 2:
        return _demo_summary(turn)
    return Reply(content=FINAL_TEXT)


def plan_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Reply:
    """The scripted model's answer to one chat completion request (raises ScriptError)."""
    turn = read_turn(messages, tools)
    script = parse_script(turn.input_text)
    return _script_reply(script, turn) if script is not None else _demo_reply(turn)


# ---------------------------------------------------------------------------
# OpenAI wire format
# ---------------------------------------------------------------------------


def _token_count(chars: int) -> int:
    return max(1, (chars + 3) // 4)


def _prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    chars = sum(len(content_text(m.get("content"))) for m in messages)
    chars += sum(len(json.dumps(m.get("tool_calls"))) for m in messages if m.get("tool_calls"))
    return _token_count(chars + (len(json.dumps(tools)) if tools else 0))


def _usage(reply: Reply, prompt_tokens: int) -> dict[str, int]:
    chars = len(reply.content or "") + sum(len(json.dumps(c["function"])) for c in reply.tool_calls)
    completion_tokens = _token_count(chars)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _completion_id(reply: Reply) -> str:
    body = json.dumps([reply.content, reply.tool_calls], sort_keys=True)
    return "chatcmpl-" + hashlib.sha1(body.encode()).hexdigest()[:24]


def _finish_reason(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def completion_body(model: str, reply: Reply, prompt_tokens: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = list(reply.tool_calls)
    return {
        "id": _completion_id(reply),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply)}],
        "usage": _usage(reply, prompt_tokens),
    }


def _chunk(reply: Reply, model: str, created: int, **choice: Any) -> dict[str, Any]:
    return {
        "id": _completion_id(reply),
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "finish_reason": None, **choice}] if choice else [],
    }


def _text_pieces(text: str) -> Iterator[str]:
    # Word-sized deltas look like a real stream and still concatenate to the exact text.
    for match in re.finditer(r"\S*\s*", text):
        if match.group(0):
            yield match.group(0)


def stream_chunks(
    model: str, reply: Reply, prompt_tokens: int, include_usage: bool
) -> Iterator[dict[str, Any]]:
    created = int(time.time())
    # Like OpenAI: a tool-call-only reply streams null content, so it rebuilds to None, not "".
    opening = "" if reply.content is not None else None
    yield _chunk(reply, model, created, delta={"role": "assistant", "content": opening})
    for piece in _text_pieces(reply.content or ""):
        yield _chunk(reply, model, created, delta={"content": piece})
    for position, call in enumerate(reply.tool_calls):
        yield _chunk(reply, model, created, delta={"tool_calls": [{"index": position, **call}]})
    yield _chunk(reply, model, created, delta={}, finish_reason=_finish_reason(reply))
    if include_usage:
        yield {**_chunk(reply, model, created), "usage": _usage(reply, prompt_tokens)}


async def _sse(chunks: list[dict[str, Any]], stream_seconds: float) -> AsyncIterator[str]:
    pause = stream_seconds / max(1, len(chunks) - 1)
    for position, chunk in enumerate(chunks):
        if position and pause:
            await asyncio.sleep(pause)
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _error(status: int, message: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=status)


# ---------------------------------------------------------------------------
# HTTP app
# ---------------------------------------------------------------------------


def append_log(log_path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line; a single O_APPEND write keeps concurrent writers from interleaving."""
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _delay(request: Request, seconds: float) -> None:
    """Simulated latency that ends early when the client hangs up (a cancelled model call)."""
    sleeper = asyncio.ensure_future(asyncio.sleep(seconds))
    hangup = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({sleeper, hangup}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        hangup.cancel()


async def _read_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise ScriptError(f"request body is not valid JSON ({exc})") from exc
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ScriptError("request body must be an object with a 'messages' list")
    return body


def _response(body: dict[str, Any], model: str, reply: Reply, prompt_tokens: int) -> Response:
    if reply.fail is not None:
        return _error(400, reply.fail)
    if not body.get("stream"):
        return JSONResponse(completion_body(model, reply, prompt_tokens))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    chunks = list(stream_chunks(model, reply, prompt_tokens, include_usage))
    return StreamingResponse(_sse(chunks, reply.stream_ms / 1000), media_type="text/event-stream")


def create_scripted_app(log_path: Path | None) -> FastAPI:
    """The scripted model as an ASGI app; every completion request is logged to ``log_path``."""
    app = FastAPI(title="Canopy scripted model", docs_url=None, redoc_url=None, openapi_url=None)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "canopy"}
        return {"object": "list", "data": [model]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        # The simulated latency counts from the request's arrival, and this model's own work is
        # part of it, as a real provider's is: the reply is ready before the wait, not after.
        arrived = time.monotonic()
        try:
            body = await _read_body(request)
        except ScriptError as exc:
            return _error(400, str(exc))
        messages, tools = body["messages"], body.get("tools")
        model = str(body.get("model") or MODEL_ID)
        if log_path is not None:
            append_log(log_path, {"ts": time.time(), "model": model, "messages": messages, "tools": tools,
                                  "stream": bool(body.get("stream"))})
        try:
            reply = plan_reply(messages, tools)
        except ScriptError as exc:
            return _error(400, str(exc))
        response = _response(body, model, reply, _prompt_tokens(messages, tools))
        latency = reply.delay_ms / 1000 - (time.monotonic() - arrived)
        if latency > 0:
            await _delay(request, latency)
        return response

    return app


# ---------------------------------------------------------------------------
# Embedded server
# ---------------------------------------------------------------------------


class _EmbeddedServer(uvicorn.Server):
    # The host process (a Ray actor or a test) owns signal handling; uvicorn must not take it.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ScriptedModelServer:
    """A running scripted model inside the current event loop."""

    def __init__(
        self, server: uvicorn.Server, sock: socket.socket, task: asyncio.Task[None], log_path: Path | None
    ) -> None:
        self._server = server
        self._task = task
        self.log_path = log_path
        self.host, self.port = sock.getsockname()[:2]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return not self._task.done()

    @property
    def in_flight_requests(self) -> int:
        """Requests still being handled; drops when a client hangs up during a delay."""
        return len(self._server.server_state.tasks)

    async def stop(self) -> None:
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _bind(host: str, port: int) -> socket.socket:
    # Binding here (not inside uvicorn) turns a busy port into an OSError for the caller
    # instead of uvicorn's sys.exit, and tells us the real port when port=0. The protocol is
    # named: asyncio turns Nagle off only for sockets whose proto is IPPROTO_TCP (accepted
    # ones inherit the listener's), and with Nagle on every reply on a kept-alive connection
    # waited ~40 ms for the client's delayed ACK — 44 ms per model call instead of 3.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_scripted_model(
    host: str = "127.0.0.1", port: int = 0, log_path: Path | str | None = None
) -> ScriptedModelServer:
    """Start the scripted model as a background task of the running loop; returns once it accepts."""
    log = Path(log_path) if log_path is not None else None
    app = create_scripted_app(log)
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1
    )
    server = _EmbeddedServer(config)
    sock = _bind(host, port)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"scripted-model:{sock.getsockname()[1]}")
    while not server.started:
        if task.done():
            sock.close()
            task.result()
            raise RuntimeError("scripted model server stopped during startup")
        await asyncio.sleep(0.01)
    return ScriptedModelServer(server, sock, task, log)
