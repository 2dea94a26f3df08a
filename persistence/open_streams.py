"""The event streams each API key holds open, counted across every API replica.

A stream takes a row when it opens (refused when its key already holds the limit), renews
the row's expiry while it stays open and deletes it when it closes. A replica that dies
leaves rows that stop counting once they expire, so a dead replica's streams free their
places after at most one lease period. Opens of one key serialise on the key's row lock.
"""

from __future__ import annotations

import uuid

from persistence.db import Connection, query
from persistence.errors import LimitReached
from persistence.records import new_id


async def open_stream(conn: Connection, key_id: uuid.UUID, *, limit: int, seconds: float,
                      setting: str = "CANOPY_MAX_STREAMS_PER_KEY") -> uuid.UUID | None:
    """A place for a new stream of the key, held for ``seconds`` unless renewed; None when the
    key is no longer live (revoked or expired meanwhile); LimitReached when it already holds
    ``limit`` (``setting`` names where the limit is configured)."""
    locked = await conn.execute(query("open_stream_lock_key"), {"key_id": key_id})
    if await locked.fetchone() is None:
        return None
    cur = await conn.execute(query("open_stream_insert"), {
        "key_id": key_id, "stream_id": new_id(), "seconds": seconds, "limit": limit})
    row = await cur.fetchone()
    if row is None:
        raise LimitReached(f"this API key already has {limit} open event streams, the most one key may hold "
                           f"({setting}); close one and retry")
    return row["stream_id"]


async def renew_stream(conn: Connection, stream_id: uuid.UUID, seconds: float) -> bool:
    """Keep the stream's place for ``seconds`` more; False when its key is revoked or expired
    (or the row is gone): the stream must end."""
    cur = await conn.execute(query("open_stream_renew"), {"stream_id": stream_id, "seconds": seconds})
    return await cur.fetchone() is not None


async def close_stream(conn: Connection, stream_id: uuid.UUID) -> None:
    await conn.execute(query("open_stream_close"), {"stream_id": stream_id})
