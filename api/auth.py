"""Bearer authentication: an API key maps to one scope (user, app); the admin token manages keys;
the metrics token (or the admin token) reads ``/metrics``.

Keys are accepted only in the ``Authorization`` header, never in a query parameter (URLs end
up in logs, histories and Referer headers). Keys are stored only as their SHA-256
(persistence/scopes.py). A checked key is cached in the process for up to a minute, so a
busy client costs no database round trip per request, and the cache never serves a key the
database would refuse:

- Revocation uses LISTEN/NOTIFY invalidation: revoking (or changing the expiry of, or
  deleting) a key fires ``canopy_keys`` with its id (a trigger in schema.sql); every
  replica's event listener (api/hub.py) passes it to ``KeyCache.forget``. Cached entries are
  trusted only while that listener is connected (without it every request reads the
  database), a (re)connect forgets everything, and a lookup that overlaps a notification is
  not cached (``KeyCache.epoch``).
- Expiry: an entry carries its key's ``expires_at`` and is not served past it.
"""

from __future__ import annotations

import datetime
import hmac
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from persistence import scopes
from persistence.db import Database
from persistence.records import Scope
from persistence.scopes import ApiKey

_CACHE_SECONDS = 60.0
_CACHE_MAX = 10_000
# auto_error=False: a missing header is our 401 with our error body, not FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="An API key (`cnp_…`), or the admin token for /admin routes.")


class KeyCache:
    """Checked keys by hash, trusted only while ``listening()`` (the invalidation listener is up)."""

    def __init__(self, listening: Callable[[], bool]) -> None:
        self._listening = listening
        self._found: dict[str, tuple[ApiKey, float]] = {}
        self.epoch = 0  # moves on every invalidation: a lookup that saw it move is not cached

    def get(self, key_hash: str) -> ApiKey | None:
        hit = self._found.get(key_hash)
        if hit is None or not self._listening():
            return None
        key, until = hit
        expired = key.expires_at is not None and key.expires_at <= datetime.datetime.now(datetime.UTC)
        if until < time.monotonic() or expired:
            del self._found[key_hash]
            return None
        return key

    def put(self, key_hash: str, key: ApiKey, epoch: int) -> None:
        if epoch != self.epoch or not self._listening():
            return
        if len(self._found) >= _CACHE_MAX:
            self._found.clear()
        self._found[key_hash] = (key, time.monotonic() + _CACHE_SECONDS)

    def forget(self, key_id: str | None) -> None:
        """Drop the key with this id; None: every key (the listener may have missed notifications)."""
        self.epoch += 1
        if key_id is None:
            self._found.clear()
            return
        for key_hash, (key, _) in list(self._found.items()):
            if str(key.key_id) == key_id:
                del self._found[key_hash]


def unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


async def lookup_key(db: Database, cache: KeyCache, api_key: str) -> ApiKey | None:
    key_hash = scopes.hash_key(api_key)
    found = cache.get(key_hash)
    if found is not None:
        return found
    epoch = cache.epoch
    async with db.tx() as conn:
        found = await scopes.authenticate(conn, api_key)
    if found is not None:
        cache.put(key_hash, found, epoch)
    return found


async def require_key(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> ApiKey:
    """The caller's live API key; 401 without one in the Authorization header."""
    if credentials is None or not credentials.credentials:
        raise unauthorized("missing API key: send 'Authorization: Bearer <api key>'")
    api_key = credentials.credentials
    if len(api_key) > 512 or not api_key.isascii():
        raise unauthorized("invalid API key")
    state = request.app.state
    found = await lookup_key(state.runtime.db, state.key_cache, api_key)
    if found is None:
        raise unauthorized("invalid, expired or revoked API key")
    return found


async def require_scope(key: Annotated[ApiKey, Depends(require_key)]) -> Scope:
    """The caller's scope; 401 without a valid API key."""
    return key.scope


def _bearer_is(credentials: HTTPAuthorizationCredentials | None, *accepted: str | None) -> bool:
    given = (credentials.credentials if credentials else "").encode()
    return any(token and hmac.compare_digest(given, token.encode()) for token in accepted)


async def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """The admin token as the bearer; 401 otherwise (also when no admin token is configured)."""
    if not _bearer_is(credentials, request.app.state.admin_token):
        raise unauthorized("this route needs the admin token (CANOPY_ADMIN_TOKEN) as the bearer")


async def require_metrics_reader(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """The metrics token or the admin token as the bearer; 401 otherwise."""
    state = request.app.state
    if not _bearer_is(credentials, state.metrics_token, state.admin_token):
        raise unauthorized("/metrics needs the metrics token (CANOPY_METRICS_TOKEN) or the admin token "
                            "(CANOPY_ADMIN_TOKEN) as the bearer")


KeyDep = Annotated[ApiKey, Depends(require_key)]
ScopeDep = Annotated[Scope, Depends(require_scope)]
