"""Request limits before any route: a body over 1 MiB is refused with 413, and one that has not
arrived whole within ``api_body_seconds`` with 408 (before the key is checked: a client that
trickles a body would otherwise hold one of the replica's request slots for as long as it likes,
and a thousand of them every slot); and one bearer's requests are served ``api_key_concurrency``
at a time until their responses start, the rest waiting their turn (``KeyShare``).

Pure ASGI (no BaseHTTPMiddleware), so streamed responses and disconnects pass through
untouched. A declared Content-Length over the limit is refused at once; a chunked body is
read up to the limit and then replayed to the app.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json

from fastapi.security.utils import get_authorization_scheme_param
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024
# A body refused unread leaves the rest of it on the connection: the connection goes.
_CLOSE = (b"connection", b"close")


async def _refuse(send: Send, status: int, detail: str, *headers: tuple[bytes, bytes]) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, body_seconds: float, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.body_seconds = body_seconds
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = f"request body exceeds {self.max_bytes} bytes"
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(send, 413, too_large, _CLOSE)
            return
        try:
            async with asyncio.timeout(self.body_seconds):
                chunks = await self._read(receive)
        except TimeoutError:
            await _refuse(send, 408, f"request body not received whole within {self.body_seconds:g} s", _CLOSE)
            return
        except _TooLarge:
            await _refuse(send, 413, too_large, _CLOSE)
            return
        if chunks is None:  # the client went
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> list[bytes] | None:
        """The body's chunks; None if the client disconnected first."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks


# Requests of one bearer that may wait for a turn, per turn: past them a request is answered 429 at
# once, so one client's flood holds few of the replica's request slots (Serve's 1,000) while it waits.
_WAITING_PER_TURN = 8


@dataclasses.dataclass
class _Share:
    turns: asyncio.Semaphore
    users: int = 0  # requests holding or awaiting a turn: the share is dropped when none does


def _bearer(scope: Scope) -> str | None:
    """The bearer credential as the route's key check reads it (the first Authorization header,
    its scheme in any case, the credential stripped): any other reading would let one key pass as
    many, each spelling with a share of its own."""
    scheme, credentials = get_authorization_scheme_param(Headers(scope=scope).get("authorization"))
    return credentials if scheme.lower() == "bearer" and credentials else None


class KeyShare:
    """One bearer's requests, served ``concurrency`` at a time in this replica; the others wait for a
    turn up to ``wait_seconds`` (at most ``_WAITING_PER_TURN`` per turn), then are answered 429. A
    replica's database connections are few (``api_db_pool_max``), and without it one key's parallel
    reads took every one of them: every other key's requests waited, then were answered 503. A turn
    lasts until the response starts: an event stream's opening holds one (its statements), its
    stream does not (``max_streams_per_key`` counts those), nor does a slow reader of a body. The
    bearer is held as its hash only, and a share only while a request holds or awaits it, whatever
    the bearer is (an invalid one is refused 401 in its turn)."""

    def __init__(self, app: ASGIApp, concurrency: int, wait_seconds: float) -> None:
        self.app = app
        self.concurrency = concurrency
        self.wait_seconds = wait_seconds
        self._shares: dict[bytes, _Share] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        bearer = _bearer(scope) if scope["type"] == "http" else None
        if bearer is None:
            await self.app(scope, receive, send)
            return
        holder = hashlib.sha256(bearer.encode()).digest()
        share = self._shares.setdefault(holder, _Share(asyncio.Semaphore(self.concurrency)))
        share.users += 1
        try:
            await self._in_turn(share, scope, receive, send)
        finally:
            share.users -= 1
            if not share.users:
                del self._shares[holder]

    async def _in_turn(self, share: _Share, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if share.users > self.concurrency * (1 + _WAITING_PER_TURN):
                raise TimeoutError
            async with asyncio.timeout(self.wait_seconds):
                await share.turns.acquire()
        except TimeoutError:
            await _refuse(send, 429, f"this API key has {self.concurrency} requests being served by this server "
                                     f"(CANOPY_API_KEY_CONCURRENCY) and others waiting: send this one again once "
                                     "fewer are under way", (b"retry-after", b"1"))
            return
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                share.turns.release()

        async def send_releasing(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receive, send_releasing)
        finally:
            release()
