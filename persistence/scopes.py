"""Scopes and API keys. A key is stored only as its SHA-256; it maps to one scope."""

from __future__ import annotations

import hashlib
import secrets

from persistence.db import Connection
from persistence.records import Scope


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


async def ensure_scope(conn: Connection, scope: Scope) -> None:
    await conn.execute(
        "INSERT INTO scopes (user_id, app_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (scope.user_id, scope.app_id),
    )


async def create_api_key(conn: Connection, scope: Scope) -> str:
    await ensure_scope(conn, scope)
    api_key = "cnp_" + secrets.token_urlsafe(32)
    await conn.execute(
        "INSERT INTO api_keys (key_hash, user_id, app_id) VALUES (%s, %s, %s)",
        (hash_key(api_key), scope.user_id, scope.app_id),
    )
    return api_key


async def scope_for_key(conn: Connection, api_key: str) -> Scope | None:
    cur = await conn.execute(
        "SELECT user_id, app_id FROM api_keys WHERE key_hash = %s", (hash_key(api_key),)
    )
    row = await cur.fetchone()
    return Scope(row["user_id"], row["app_id"]) if row else None
