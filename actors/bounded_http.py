"""How much of a model endpoint's answer the gateway reads: an endpoint's bytes are untrusted.

litellm reads a whole (not streamed) reply's body before anything can count its characters, and a
stream line by line, a line whole; an endpoint that sends 100 MB without ending its first line held
~5 × that in the gateway, which every session of its node shares. The gateway's HTTP client (handed
to litellm as ``litellm.aclient_session``: what litellm's OpenAI and Azure clients use, that is every
endpoint reached as ``openai/…`` or ``azure/…``; its other providers have HTTP clients of their own)
stops reading a body past the bound of the call under way, and refuses to send that call's further
attempts (the Router would retry a dropped connection, and each attempt would be billed and read
again). Nothing the endpoint says of its body loosens the bound: a whole reply is bounded whole
whatever its content type (only a call the gateway streams is read line by line), and a compressed
body is counted as it inflates (identity is asked for; gzip and deflate are inflated here, in
bounded steps; any other encoding is refused). The bound travels with the call in a context
variable: one client serves every gateway of the process, each with its own limit (tests make
several).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import zlib
from collections.abc import AsyncIterator, Iterator

import httpx

# A JSON string escapes a character in at most 6 bytes (\uXXXX), around which a reply's envelope
# (ids, usage, tool-call names) adds little: a body this many times the characters a reply may hold,
# plus this much, holds any reply that is not refused for its length anyway.
_BYTES_PER_CHAR = 8
_ENVELOPE_BYTES = 1 << 20
_INFLATED = {"gzip", "x-gzip", "deflate"}


@dataclasses.dataclass
class Bound:
    """One model call's bound: the bytes of a body (of a line, while ``by_line``: the gateway streams
    the call) read at most; ``cut``: why a body stopped being read."""

    max_bytes: int
    by_line: bool = False
    cut: str | None = None

    @classmethod
    def for_reply_chars(cls, max_reply_chars: int) -> Bound:
        return cls(_BYTES_PER_CHAR * max_reply_chars + _ENVELOPE_BYTES)


class BodyRefused(Exception):
    """A body passed its call's bound, or came in an encoding that cannot be bounded: nothing more of
    it is read."""


_current: contextvars.ContextVar[Bound | None] = contextvars.ContextVar("canopy_model_call_bound", default=None)


@contextlib.contextmanager
def bounded(bound: Bound) -> Iterator[Bound]:
    """The HTTP requests made inside (by this task, or tasks it starts) are bound by ``bound``."""
    token = _current.set(bound)
    try:
        yield bound
    finally:
        _current.reset(token)


def _refuse(bound: Bound, why: str) -> BodyRefused:
    bound.cut = why
    return BodyRefused(why)


class _BoundedStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, bound: Bound, encoding: str) -> None:
        self._stream = stream
        self._bound = bound
        self._by_line = bound.by_line
        # wbits 32 + MAX_WBITS: a gzip or a zlib header, as each encoding's body starts.
        self._inflater = zlib.decompressobj(32 + zlib.MAX_WBITS) if encoding in _INFLATED else None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = 0  # the bytes of the body so far, or of the current line
        async for raw in self._stream:
            chunk = raw
            if self._inflater is not None:
                try:  # at most one byte past the bound at a time, whatever the compression's ratio
                    chunk = self._inflater.decompress(raw, self._bound.max_bytes + 1 - held)
                except zlib.error as error:
                    raise _refuse(self._bound, f"its compressed body is broken ({error})") from error
                if self._inflater.unconsumed_tail:
                    raise _refuse(self._bound, f"its body passed {self._bound.max_bytes:,} bytes")
            newline = chunk.rfind(b"\n") if self._by_line else -1
            held = len(chunk) - newline - 1 if newline >= 0 else held + len(chunk)
            if held > self._bound.max_bytes:
                line = " in one line" if self._by_line else ""
                raise _refuse(self._bound, f"its body passed {self._bound.max_bytes:,} bytes{line}")
            yield chunk
        if self._inflater is not None and (tail := self._inflater.flush()):
            if held + len(tail) > self._bound.max_bytes:
                raise _refuse(self._bound, f"its body passed {self._bound.max_bytes:,} bytes")
            yield tail

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _ask_identity(request: httpx.Request) -> None:
    bound = _current.get()
    if bound is not None and bound.cut:
        raise BodyRefused(f"an earlier attempt of this call was refused ({bound.cut}): not asked again")
    request.headers["accept-encoding"] = "identity"


async def _bind_body(response: httpx.Response) -> None:
    # Response hooks run before the body is read, whether the caller streams it or not.
    bound = _current.get()
    if bound is None:
        return
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in _INFLATED | {"identity", ""}:
        raise _refuse(bound, f"its body came in the {encoding!r} encoding, which is not read")
    if encoding in _INFLATED:
        del response.headers["content-encoding"]  # inflated here, in bounded steps: not by httpx again
    response.stream = _BoundedStream(response.stream, bound, encoding)


def client() -> httpx.AsyncClient:
    """The gateway's client for litellm: httpx's own transport (and the environment's proxies), as
    litellm's default client for the OpenAI SDK, with the bound. One client for every deployment, so
    no cap on connections (litellm made a client of 100 per deployment): the tree slots bound them.
    It keeps connections of the event loop that used it first, as litellm keeps its clients: a
    gateway serves from one loop (its actor's). No redirect is followed: an agent's endpoint is
    allowed by its address, and a redirect would take its calls (their conversations) to another."""
    return httpx.AsyncClient(event_hooks={"request": [_ask_identity], "response": [_bind_body]},
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
                             follow_redirects=False)
