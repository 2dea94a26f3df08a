"""The scripted model's HTTP endpoint: OpenAI's chat completions API, served inside the current
event loop (the ModelGateway actor's, or a test's).

The gateway serves every model call of the cluster on that loop, so a request costs time linear in
its size and no more: a body over ``Limits.request_bytes`` is refused (HTTP 400) before it is read,
and what it asks for is bounded by :class:`actors.scripted.model.Limits`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from actors.scripted.model import MODEL_ID, Limits, Reply, content_text, plan_reply
from actors.scripted.script import ScriptError
from persistence.settings import get_settings

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


def _chunk(head: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {**head, "choices": [{"index": 0, "finish_reason": None, **choice}] if choice else []}


def _text_pieces(text: str) -> Iterator[str]:
    """Word-sized deltas (each word with the whitespace after it; leading whitespace alone): they look
    like a real stream and still concatenate to the exact text."""
    piece = ""
    for is_space, run in itertools.groupby(text, str.isspace):
        chars = "".join(run)
        if piece and not is_space:
            yield piece
            piece = chars
        else:
            piece += chars
    if piece:
        yield piece


def stream_chunks(
    model: str, reply: Reply, prompt_tokens: int, include_usage: bool
) -> Iterator[dict[str, Any]]:
    # The id hashes the whole reply: once per reply, not once per chunk.
    head = {"id": _completion_id(reply), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}
    # Like OpenAI: a tool-call-only reply streams null content, so it rebuilds to None, not "".
    opening = "" if reply.content is not None else None
    yield _chunk(head, delta={"role": "assistant", "content": opening})
    for piece in _text_pieces(reply.content or ""):
        yield _chunk(head, delta={"content": piece})
    for position, call in enumerate(reply.tool_calls):
        yield _chunk(head, delta={"tool_calls": [{"index": position, **call}]})
    yield _chunk(head, delta={}, finish_reason=_finish_reason(reply))
    if include_usage:
        yield {**_chunk(head), "usage": _usage(reply, prompt_tokens)}


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
    """Append one JSON line; a single O_APPEND write keeps concurrent writers from interleaving. The
    file is its user's only: it holds whole conversations."""
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a log an earlier version made readable by others, too
        os.write(fd, line)
    finally:
        os.close(fd)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _delay(request: Request, seconds: float) -> bool:
    """Simulated latency that ends early when the client hangs up (a cancelled model call);
    True when it did."""
    sleeper = asyncio.ensure_future(asyncio.sleep(seconds))
    hangup = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({sleeper, hangup}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        hangup.cancel()
    return hangup.done() and not hangup.cancelled()


async def _read_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request's JSON object; a body over ``max_bytes`` is refused as soon as that is known,
    unread (by its Content-Length) or before the rest of it is read."""
    too_large = ScriptError(f"the request body is over {max_bytes} bytes (the scripted model's limit, "
                            f"CANOPY_SCRIPTED_MAX_REQUEST_BYTES); it was not read")
    # The HTTP server has already validated the header as a number of bytes.
    declared = request.headers.get("content-length", "")
    if declared.isdecimal() and int(declared) > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except RecursionError as exc:
        raise ScriptError("request body is nested too deeply") from exc
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


def create_scripted_app(log_path: Path | None, limits: Limits) -> FastAPI:
    """The scripted model as an ASGI app; every completion request it reads is logged to ``log_path``."""
    app = FastAPI(title="Canopy scripted model", docs_url=None, redoc_url=None, openapi_url=None)
    # The latest requests whose client hung up before their delay was over: a gateway's scripted
    # model serves as long as the gateway lives, so what it keeps for tests is bounded.
    app.state.hangups = collections.deque(maxlen=1000)
    # The requests waiting out their delay now, by delay in seconds: which of a test's calls are still
    # at the model, whatever other tests' calls are.
    app.state.waiting = collections.Counter()
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
            body = await _read_body(request, limits.request_bytes)
            messages, tools = body["messages"], body.get("tools")
            model = str(body.get("model") or MODEL_ID)
            if log_path is not None:
                append_log(log_path, {"ts": time.time(), "model": model, "messages": messages, "tools": tools,
                                      "stream": bool(body.get("stream"))})
            reply = plan_reply(messages, tools, limits)
            response = _response(body, model, reply, _prompt_tokens(messages, tools))
        except ScriptError as exc:
            return _error(400, str(exc))
        except RecursionError:
            # JSON nested near the interpreter's recursion limit parses, yet a walk over it may not.
            return _error(400, "the request is nested too deeply")
        delay = reply.delay_ms / 1000
        latency = delay - (time.monotonic() - arrived)
        if latency > 0:
            waiting = app.state.waiting
            waiting[delay] += 1
            try:
                hung_up = await _delay(request, latency)
            finally:
                waiting[delay] -= 1
                if not waiting[delay]:
                    del waiting[delay]
            if hung_up:
                app.state.hangups.append({"after_seconds": time.monotonic() - arrived, "delay_seconds": delay})
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

    @property
    def waiting(self) -> dict[float, int]:
        """The requests waiting out their delay now, by delay in seconds."""
        return dict(self._server.config.app.state.waiting)

    @property
    def hangups(self) -> list[dict[str, float]]:
        """The latest requests (up to 1,000) whose client hung up during their delay: after how long,
        of how long."""
        return list(self._server.config.app.state.hangups)

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
    host: str = "127.0.0.1", port: int = 0, log_path: Path | str | None = None, limits: Limits | None = None
) -> ScriptedModelServer:
    """Start the scripted model as a background task of the running loop; returns once it accepts.
    ``limits`` default to the settings' (``CANOPY_SCRIPTED_MAX_*``)."""
    log = Path(log_path) if log_path is not None else None
    app = create_scripted_app(log, limits or Limits.from_settings(get_settings()))
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
