"""Scopes and API keys.

A key is stored only as its SHA-256 and maps to one scope. It has a non-secret ``key_id``
(operators name a key by it to revoke it), an optional expiry, a revocation instant and a
last use, written at most about once a minute per key (``TOUCH_SECONDS``). A revoked or
expired key authenticates nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import secrets
import uuid

from persistence.db import Connection, query
from persistence.errors import InvalidArgument, NotFound
from persistence.records import Row, Scope

# A key's last use is written when the stored one is older than this, not on every request.
TOUCH_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class ApiKey:
    """An authenticated key: who it is (``key_id``), whose (``scope``) and until when."""

    key_id: uuid.UUID
    scope: Scope
    expires_at: datetime.datetime | None


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


async def ensure_scope(conn: Connection, scope: Scope) -> None:
    await conn.execute(
        "INSERT INTO scopes (user_id, app_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (scope.user_id, scope.app_id),
    )


async def issue_key(conn: Connection, scope: Scope, *, expires_at: datetime.datetime | None = None,
                    expires_in_seconds: float | None = None) -> tuple[str, Row]:
    """A new key for the scope and its row (``key_id``, ``expires_at``, ...). The key itself is
    returned only here. At most one of ``expires_at`` and ``expires_in_seconds``."""
    if expires_at is not None and expires_in_seconds is not None:
        raise InvalidArgument("give expires_at or expires_in_seconds, not both")
    if expires_at is not None and expires_at <= datetime.datetime.now(datetime.UTC):
        raise InvalidArgument("expires_at must be in the future")
    if expires_in_seconds is not None and expires_in_seconds <= 0:
        raise InvalidArgument("expires_in_seconds must be positive")
    await ensure_scope(conn, scope)
    api_key = "cnp_" + secrets.token_urlsafe(32)
    cur = await conn.execute(query("api_key_insert"), {
        "key_hash": hash_key(api_key), "user_id": scope.user_id, "app_id": scope.app_id,
        "expires_at": expires_at, "expires_in": expires_in_seconds})
    row = await cur.fetchone()
    assert row is not None
    return api_key, row


async def create_api_key(conn: Connection, scope: Scope) -> str:
    """A new key for the scope that never expires."""
    api_key, _ = await issue_key(conn, scope)
    return api_key


async def authenticate(conn: Connection, api_key: str, touch_seconds: float = TOUCH_SECONDS) -> ApiKey | None:
    """The live key (not revoked, not expired) ``api_key`` is, or None; records its use."""
    cur = await conn.execute(query("api_key_authenticate"),
                             {"key_hash": hash_key(api_key), "touch_seconds": touch_seconds})
    row = await cur.fetchone()
    return ApiKey(row["key_id"], Scope(row["user_id"], row["app_id"]), row["expires_at"]) if row else None


async def revoke_key(conn: Connection, key_id: uuid.UUID) -> Row:
    """Revoke the key (again: a no-op); NotFound for an unknown id."""
    revoked = await revoke_keys(conn, [key_id])
    if not revoked:
        raise NotFound(f"no API key {key_id}")
    return revoked[0]


async def revoke_keys(conn: Connection, key_ids: list[uuid.UUID]) -> list[Row]:
    """Revoke the keys (again: a no-op); the rows of those that exist (ids unknown here are not)."""
    cur = await conn.execute(query("api_key_revoke"), {"key_ids": key_ids})
    return await cur.fetchall()


async def list_keys(conn: Connection, *, user_id: str | None, app_id: str | None, offset: int,
                    limit: int) -> list[Row]:
    """A page of the keys (of ``user_id`` / ``app_id`` when given) without their hashes, oldest first."""
    cur = await conn.execute(query("api_key_list"), {"user_id": user_id, "app_id": app_id, "offset": offset,
                                                     "limit": limit})
    return await cur.fetchall()
