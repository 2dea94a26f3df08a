"""HTTP ``Idempotency-Key`` receipts, with the semantics of tool receipts.

The same key with the same request returns the stored response and writes nothing; the
same key with another request is refused. A receipt is stored in the same transaction as
the write it answers, so a write and its receipt commit (or vanish) together.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from psycopg.types.json import Jsonb

from persistence.db import Connection
from persistence.errors import CanopyError
from persistence.records import Row, Scope

MAX_KEY_LENGTH = 255


class IdempotencyKeyReused(CanopyError):
    """The key was already used for a different request (IETF idempotency-key draft: 422)."""


def request_fingerprint(method: str, path: str, body: Any) -> str:
    """A stable hash of what the request asks for (method, path and the validated body)."""
    canonical = json.dumps([method.upper(), path, body], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def stored_response(conn: Connection, scope: Scope, key: str, fingerprint: str) -> Row | None:
    """The stored response for this key, None when the key is new; refuses a reused key."""
    cur = await conn.execute(
        """SELECT request_hash, status_code, response FROM http_idempotency
           WHERE user_id = %s AND app_id = %s AND idempotency_key = %s""",
        (scope.user_id, scope.app_id, key),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    if row["request_hash"] != fingerprint:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for a different request; use a new key for new work"
        )
    return {"status_code": row["status_code"], "response": row["response"]}


async def store_response(conn: Connection, scope: Scope, key: str, fingerprint: str, status_code: int,
                         response: Any) -> bool:
    """Record the response in the caller's transaction. False: a concurrent request won the key.

    A concurrent insert of the same key blocks here until the other transaction ends, so
    the loser sees the winner's committed receipt and must roll its own write back.
    """
    cur = await conn.execute(
        """INSERT INTO http_idempotency (user_id, app_id, idempotency_key, request_hash, status_code, response)
           VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1""",
        (scope.user_id, scope.app_id, key, fingerprint, status_code, Jsonb(response)),
    )
    return await cur.fetchone() is not None
