"""Security headers on every response: the web UI shows what models wrote, and keeps its API key in
the browser's storage, so a page of it must run no script but its own files, be framed by no other
site (its Approve button), and leak nothing through referrers or content sniffing.

The API reference pages (``/docs``, ``/redoc``: FastAPI's, with their scripts from a CDN, pinned and
checked by hash, api/reference.py) get every header but the content policy, which would stop them.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
_ALWAYS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
# Exactly these paths: a prefix would also match "/docs%2F..%2F", which the server decodes to
# "/docs/../" and the static files serve as the UI's own page, without its policy.
_REFERENCE_PAGES = frozenset({"/docs", "/redoc"})


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        added = list(_ALWAYS)
        if scope["path"] not in _REFERENCE_PAGES:
            added.append((b"content-security-policy", CONTENT_POLICY.encode()))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, with_headers)
