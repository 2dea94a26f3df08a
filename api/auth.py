"""Bearer authentication: an API key maps to one scope (user, app); the admin token creates keys.

Keys are stored only as their SHA-256 (persistence/scopes.py). A found key is cached in the
process for a minute, so a busy client costs no database round trip per request; keys
cannot be revoked today, so the cache never serves a key the database would refuse.
"""

from __future__ import annotations

import hmac
import time
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from persistence import scopes
from persistence.db import Database
from persistence.records import Scope

_CACHE_SECONDS = 60.0
_CACHE_MAX = 10_000
# auto_error=False: a missing header is our 401 with our error body, not FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="An API key (`cnp_…`), or the admin token for /admin routes.")


class KeyCache:
    def __init__(self) -> None:
        self._found: dict[str, tuple[Scope, float]] = {}

    def get(self, key_hash: str) -> Scope | None:
        hit = self._found.get(key_hash)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def put(self, key_hash: str, scope: Scope) -> None:
        if len(self._found) >= _CACHE_MAX:
            self._found.clear()
        self._found[key_hash] = (scope, time.monotonic() + _CACHE_SECONDS)


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


async def scope_of_key(db: Database, cache: KeyCache, api_key: str) -> Scope | None:
    key_hash = scopes.hash_key(api_key)
    found = cache.get(key_hash)
    if found is not None:
        return found
    async with db.tx() as conn:
        found = await scopes.scope_for_key(conn, api_key)
    if found is not None:
        cache.put(key_hash, found)
    return found


async def require_scope(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Scope:
    """The caller's scope; 401 without a valid API key."""
    if credentials is None or not credentials.credentials:
        raise _unauthorized("missing API key: send 'Authorization: Bearer <api key>'")
    api_key = credentials.credentials
    if len(api_key) > 512 or not api_key.isascii():
        raise _unauthorized("invalid API key")
    state = request.app.state
    found = await scope_of_key(state.runtime.db, state.key_cache, api_key)
    if found is None:
        raise _unauthorized("invalid API key")
    return found


async def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """The admin token as the bearer; 401 otherwise (also when no admin token is configured)."""
    expected: str | None = request.app.state.admin_token
    given = credentials.credentials if credentials else ""
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise _unauthorized("this route needs the admin token (CANOPY_ADMIN_TOKEN) as the bearer")


ScopeDep = Annotated[Scope, Depends(require_scope)]
