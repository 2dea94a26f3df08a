"""A tiny OpenAI-compatible chat completions server for provider tests: it replays, per model
name, a list of steps (tool calls with an optional ``text``, a final answer, an HTTP error with
headers, a raw ``body``, or a ``flood`` of bytes; a reply may be sent slowly, ``drip`` seconds
between its pieces, or cut off after ``break_after`` of them) and records every request it
receives (arrival time, model, Authorization header, body). It is not Canopy's scripted model: it
knows nothing of Canopy and reads no script from the prompt, so a test through it exercises
litellm's OpenAI provider, its Router and Canopy's routing exactly as with a real provider. Served
by uvicorn on a free loopback port in a thread of its own."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from tests.ports import free_port


@dataclasses.dataclass
class Received:
    at: float  # time.monotonic() on arrival
    model: str
    authorization: str | None
    body: dict[str, Any]


def say(text: str) -> dict[str, Any]:
    return {"say": text}


def calls(*tool_calls: tuple[str, dict[str, Any] | str] | tuple[str, dict[str, Any] | str, str]) -> dict[str, Any]:
    """A reply of tool calls (name, arguments[, call id]); arguments given as a string are sent as
    they are (a provider's raw text)."""
    return {"call": [{"name": c[0], "args": c[1], **({"id": c[2]} if len(c) > 2 else {})} for c in tool_calls]}


def fail(status: int, message: str | None = None, **headers: str) -> dict[str, Any]:
    return {"status": status, "headers": headers, **({"message": message} if message is not None else {})}


def _message(step: dict[str, Any], index: int) -> tuple[dict[str, Any], str]:
    if "say" in step:
        return {"role": "assistant", "content": step["say"]}, "stop"
    tool_calls = [{"id": c.get("id", f"call_{index}_{n}"), "type": "function",
                   "function": {"name": c["name"], "arguments": c["args"] if isinstance(c["args"], str)
                                else json.dumps(c["args"])}}
                  for n, c in enumerate(step["call"])]
    return {"role": "assistant", "content": step.get("text"), "tool_calls": tool_calls}, "tool_calls"


_USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def _sse(model: str, message: dict[str, Any], finish: str, usage: dict[str, Any] | None, drip: float) -> Iterator[str]:
    """The reply as content/tool-call deltas (one for the whole text, or, dripped, one a character),
    then the finish, then the usage chunk (if any)."""
    base = {"id": "chatcmpl-replay", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    text = message.get("content")
    texts = list(text or "") if drip else [text]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": texts[0] if texts else None},
                                    *({"content": piece} for piece in texts[1:])]
    if message.get("tool_calls"):
        deltas[-1]["tool_calls"] = [{**call, "index": n} for n, call in enumerate(message["tool_calls"])]
    chunks = [*({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas),
              {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
    for chunk in chunks + ([{**base, "choices": [], "usage": usage}] if usage else []):
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


async def _sent(pieces: Iterator[str], drip: float, break_after: int | None) -> AsyncIterator[str]:
    """``pieces`` with ``drip`` seconds between them; with ``break_after``, the connection is cut
    after that many (as a provider's proxy that drops it mid-reply)."""
    for n, piece in enumerate(pieces):
        if n == break_after:
            raise ConnectionResetError("replay server: the connection is cut mid-reply")
        if n and drip:
            await asyncio.sleep(drip)
        yield piece


def flood(size: int, *, streamed: bool, event_stream: bool | None = None, gzip: bool = False,
          line_every: int | None = None) -> dict[str, Any]:
    """A reply of ``size`` bytes that never ends its first line: the start of a completion's JSON
    (or of a stream's first event) and then one character over and over, as a broken or hostile
    endpoint may send: labelled an event stream or not (``event_stream``, by default as
    ``streamed``), gzip-compressed (``size`` is then what it inflates to), or with a newline every
    ``line_every`` bytes. The server records how much of it the client read (``flood_sent``: bytes
    before compression)."""
    return {"flood": size, "streamed": streamed, "event_stream": streamed if event_stream is None else event_stream,
            "gzip": gzip, "line_every": line_every}


async def _flooding(step: dict[str, Any], sent: dict[str, int], model: str, request: Request
                    ) -> AsyncIterator[bytes]:
    head = b'data: {"choices": [{"index": 0, "delta": {"content": "' if step["streamed"] else \
        b'{"id": "chatcmpl-replay", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "'
    piece = b"y" * (step["line_every"] - 1) + b"\n" if step["line_every"] else b"y" * 65_536
    packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16) if step["gzip"] else None
    sent[model] = len(head)
    yield packer.compress(head) if packer else head
    # uvicorn drops what is sent after the client hung up: what was sent is what was sent before.
    while sent[model] < step["flood"] and not await request.is_disconnected():
        sent[model] += len(piece)
        yield packer.compress(piece) + packer.flush(zlib.Z_SYNC_FLUSH) if packer else piece
    if packer:
        yield packer.flush()


def _slices(text: str, size: int = 16) -> Iterator[str]:
    return (text[i:i + size] for i in range(0, len(text), size))


def _json(body: dict[str, Any], status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    # ASCII JSON, as the stream's chunks: a reply may carry a lone surrogate, which only an escape can.
    return Response(json.dumps(body), status_code=status_code, headers=headers, media_type="application/json")


class ReplayServer:
    """Steps per model name, taken in order; when a model's steps run out, ``then`` answers
    (by default an HTTP 500 that says so)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.flood_sent: dict[str, int] = {}  # bytes of a flood (``flood``) handed to the connection, by model
        self._steps: dict[str, list[dict[str, Any]]] = {}
        self._then: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self.port = 0
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, model: str, *steps: dict[str, Any], then: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._steps[model] = list(steps)
            self._then[model] = then or fail(500)

    def requests_for(self, model: str) -> list[Received]:
        return [r for r in self.received if r.model == model]

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        model = body["model"]
        with self._lock:
            self.received.append(Received(time.monotonic(), model, request.headers.get("authorization"), body))
            steps = self._steps.get(model, [])
            step = steps.pop(0) if steps else self._then.get(model, fail(404))
            index = len(self.requests_for(model))
        if "flood" in step:
            return StreamingResponse(_flooding(step, self.flood_sent, model, request),
                                     media_type="text/event-stream" if step["event_stream"] else "application/json",
                                     headers={"content-encoding": "gzip"} if step["gzip"] else None)
        if "body" in step:  # a whole response as the provider would send it, however malformed
            return _json(step["body"])
        if "status" in step:
            text = step.get("message", f"replay server: HTTP {step['status']} for {model}")
            error = {"error": {"message": text, "type": "replay", "code": step["status"]}}
            return _json(error, status_code=step["status"], headers=step["headers"])
        message, finish = _message(step, index)
        usage = step.get("usage", _USAGE)  # None: a provider that reports no usage
        drip, break_after = step.get("drip", 0.0), step.get("break_after")
        if body.get("stream"):
            return StreamingResponse(_sent(_sse(model, message, finish, usage, drip), drip, break_after),
                                     media_type="text/event-stream")
        whole = {"id": "chatcmpl-replay", "object": "chat.completion", "created": int(time.time()),
                 "model": model, **({"usage": usage} if usage else {}),
                 "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if step.get("gzip"):  # compressed whatever the request asked for, as some servers do
            return Response(gzip.compress(json.dumps(whole).encode()), media_type="application/json",
                            headers={"content-encoding": "gzip"})
        if drip or break_after is not None:  # the body in slices of 16 characters
            return StreamingResponse(_sent(_slices(json.dumps(whole)), drip, break_after),
                                     media_type="application/json")
        return _json(whole)

    def start(self, port: int | None = None) -> ReplayServer:
        self.port = port or free_port()
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     lifespan="off"))
        threading.Thread(target=self._server.run, name="replay-server", daemon=True).start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the replay server did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
