"""Request body limits: a body over 1 MiB is refused with 413, and one that has not arrived whole
within ``api_body_seconds`` with 408, before any route sees it (and before the key is checked:
a client that trickles a body would otherwise hold one of the replica's request slots for as long
as it likes, and a thousand of them every slot).

Pure ASGI (no BaseHTTPMiddleware), so streamed responses and disconnects pass through
untouched. A declared Content-Length over the limit is refused at once; a chunked body is
read up to the limit and then replayed to the app.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
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
            await _refuse(send, 413, too_large)
            return
        try:
            async with asyncio.timeout(self.body_seconds):
                chunks = await self._read(receive)
        except TimeoutError:
            await _refuse(send, 408, f"request body not received whole within {self.body_seconds:g} s")
            return
        except _TooLarge:
            await _refuse(send, 413, too_large)
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
