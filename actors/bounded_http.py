"""How much of a model endpoint's answer the gateway reads: an endpoint's bytes are untrusted.

litellm reads a whole (not streamed) reply's body before anything can count its characters, and a
stream line by line, a line whole; an endpoint that sends 100 MB without ending its first line held
~5 × that in the gateway, which every session of its node shares. The gateway's HTTP client (handed
to litellm as ``litellm.aclient_session``: every provider litellm reaches through its OpenAI client,
which is every OpenAI-compatible endpoint an agent may name) stops reading a body, or a stream's
line, past the bound of the call under way, and refuses to send that call's further attempts (the
Router would retry a dropped connection, and each attempt would be billed and read again). The
bound travels with the call in a context variable: one client serves every gateway of the process,
each with its own limit (tests make several).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator, Iterator

import httpx

# A JSON string escapes a character in at most 6 bytes (\uXXXX), around which a reply's envelope
# (ids, usage, tool-call names) adds little: a body this many times the characters a reply may hold,
# plus this much, holds any reply that is not refused for its length anyway.
_BYTES_PER_CHAR = 8
_ENVELOPE_BYTES = 1 << 20


@dataclasses.dataclass
class Bound:
    """One model call's bound: the bytes of a body (a stream's: of a line) read at most; ``cut``
    once a body passed it."""

    max_bytes: int
    cut: bool = False

    @classmethod
    def for_reply_chars(cls, max_reply_chars: int) -> Bound:
        return cls(_BYTES_PER_CHAR * max_reply_chars + _ENVELOPE_BYTES)


class BodyTooLarge(Exception):
    """A body (or a stream's line) passed its call's bound: nothing more of it is read."""


_current: contextvars.ContextVar[Bound | None] = contextvars.ContextVar("canopy_model_call_bound", default=None)


@contextlib.contextmanager
def bounded(bound: Bound) -> Iterator[Bound]:
    """The HTTP requests made inside (by this task, or tasks it starts) are bound by ``bound``."""
    token = _current.set(bound)
    try:
        yield bound
    finally:
        _current.reset(token)


class _BoundedStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, bound: Bound, *, by_line: bool) -> None:
        self._stream = stream
        self._bound = bound
        self._by_line = by_line

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = 0  # the bytes of the body so far, or of the stream's current line
        async for chunk in self._stream:
            newline = chunk.rfind(b"\n") if self._by_line else -1
            held = len(chunk) - newline - 1 if newline >= 0 else held + len(chunk)
            if held > self._bound.max_bytes:
                self._bound.cut = True
                raise BodyTooLarge(f"the endpoint's answer passed {self._bound.max_bytes:,} bytes"
                                   f"{' in one line' if self._by_line else ''}")
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _refuse_after_a_cut(request: httpx.Request) -> None:
    bound = _current.get()
    if bound is not None and bound.cut:
        raise BodyTooLarge("an earlier attempt of this call was answered past its bound: not asked again")


async def _bind_body(response: httpx.Response) -> None:
    # Response hooks run before the body is read, whether the caller streams it or not.
    bound = _current.get()
    if bound is not None:
        event_stream = response.headers.get("content-type", "").startswith("text/event-stream")
        response.stream = _BoundedStream(response.stream, bound, by_line=event_stream)


def client() -> httpx.AsyncClient:
    """The gateway's client for litellm: httpx's own transport (and the environment's proxies), as
    litellm's default client for the OpenAI SDK, with the bound. One client for every deployment, so
    no cap on connections (litellm made a client of 100 per deployment): the tree slots bound them.
    No redirect is followed: an agent's endpoint is allowed by its address, and a redirect would take
    its calls (their conversations) to another."""
    return httpx.AsyncClient(event_hooks={"request": [_refuse_after_a_cut], "response": [_bind_body]},
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
                             follow_redirects=False)
