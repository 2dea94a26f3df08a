"""Every POST write goes through ``respond_to_write``: the optional ``Idempotency-Key`` header.

With a key, the request's fingerprint (method, route and ids, validated body) is checked against a
stored receipt first: the same request gets the stored response and nothing is written; a
different request with the same key gets 422. A new key's receipt is written inside the
write's own transaction (``Runtime``'s ``in_tx`` hook), so a write and its receipt commit
together; of two concurrent requests with one key, the second waits for the first, rolls
its own write back and answers with the first one's stored response; one the first's write
refused (the quota's last place, or the id it made, taken) answers with that response too.

Only successful writes leave a receipt: a refused request (4xx) wrote nothing, so its retry
is simply tried again. Receipts are scoped to (user, app) and kept (no expiry yet). PATCH
and DELETE routes are idempotent by themselves (a DELETE sent again deletes nothing and answers
404) and take no key; neither do the admin routes.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from actors.runtime import TxHook
from persistence import idempotency
from persistence.db import Connection, Database
from persistence.errors import CanopyError
from persistence.records import Row, Scope

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=idempotency.MAX_KEY_LENGTH, pattern=r"^[\x21-\x7e]+$",
           description="Optional. Retrying a write with the same key returns the first response and writes "
                       "nothing; reusing a key for a different request is refused (422)."),
]
REPLAYED_HEADER = "Idempotent-Replayed"


class _LostRace(Exception):
    """A concurrent request with the same key committed first: roll this write back."""


def _replay(stored: Row) -> JSONResponse:
    return JSONResponse(stored["response"], status_code=stored["status_code"], headers={REPLAYED_HEADER: "true"})


async def respond_to_write(
    request: Request,
    scope: Scope,
    key: str | None,
    body: BaseModel | None,
    status_code: int,
    perform: Callable[[TxHook | None], Awaitable[Any]],
    render: Callable[[Any], BaseModel],
) -> JSONResponse:
    """Run ``perform`` (a Runtime write taking an ``in_tx`` hook) and answer with ``render(result)``."""
    if key is None:
        return JSONResponse(render(await perform(None)).model_dump(mode="json"), status_code=status_code)
    db = request.app.state.runtime.db
    fingerprint = idempotency.request_fingerprint(
        request.method, _canonical_path(request), body.model_dump(mode="json") if body is not None else None)
    if (stored := await _stored_now(db, scope, key, fingerprint)) is not None:
        return _replay(stored)
    rendered: dict[str, Any] = {}

    async def store_receipt(conn: Connection, result: Any) -> None:
        content = render(result).model_dump(mode="json")
        if not await idempotency.store_response(conn, scope, key, fingerprint, status_code, content):
            raise _LostRace
        rendered["content"] = content

    try:
        await perform(store_receipt)
    except _LostRace:
        stored = await _stored_now(db, scope, key, fingerprint)
        assert stored is not None, "the winning request committed its receipt"
        return _replay(stored)
    except CanopyError as refusal:
        # The refusal can be the doing of the same request sent first and committed meanwhile (it
        # took the quota's last place, or the id this one would make): then this is its retry. A key
        # another request took meanwhile changes nothing: the refusal stands.
        try:
            stored = await _stored_now(db, scope, key, fingerprint)
        except idempotency.IdempotencyKeyReused:
            raise refusal from None
        if stored is None:
            raise
        return _replay(stored)
    return JSONResponse(rendered["content"], status_code=status_code)


def _canonical_path(request: Request) -> str:
    """The request's path with each id in it spelled one way: a retry may spell a UUID in capitals,
    without hyphens or as a URN (a client library, a proxy), and is still the same request."""
    params = {name: _canonical_id(value) for name, value in request.path_params.items()}
    return str(request.scope["route"].path_format.format(**params))


def _canonical_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return value  # an agent's id: its own spelling


async def _stored_now(db: Database, scope: Scope, key: str, fingerprint: str) -> Row | None:
    async with db.tx() as conn:
        return await idempotency.stored_response(conn, scope, key, fingerprint)
