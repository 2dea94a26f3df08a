"""Operator routes: the admin token (``CANOPY_ADMIN_TOKEN``) creates, lists and revokes API keys."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from api.auth import require_admin
from api.deps import Offset, QueryInt, RuntimeDep, errors
from api.schemas import KeyCreate, KeyCreated, KeyInfo, ScopeId
from persistence import scopes
from persistence.records import Scope

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])


@router.post("/keys", status_code=status.HTTP_201_CREATED, response_model=KeyCreated,
             responses=errors(401, 413, 422))
async def create_key(body: KeyCreate, runtime: RuntimeDep) -> KeyCreated:
    """A new API key for the scope (user_id, app_id), optionally expiring. The key is shown once;
    only its hash is kept."""
    async with runtime.db.tx() as conn:
        api_key, row = await scopes.issue_key(conn, Scope(body.user_id, body.app_id), expires_at=body.expires_at,
                                              expires_in_seconds=body.expires_in_seconds)
    return KeyCreated(api_key=api_key, **row)


@router.get("/keys", response_model=list[KeyInfo], responses=errors(401, 422))
async def list_keys(runtime: RuntimeDep, user_id: Annotated[ScopeId | None, Query()] = None,
                    app_id: Annotated[ScopeId | None, Query()] = None, offset: Offset = 0,
                    limit: Annotated[QueryInt, Query(ge=1, le=1000)] = 1000) -> list[KeyInfo]:
    """A page of the API keys (of one user or app when given), oldest first (a shorter page: the
    last): ids, scopes and dates, never the keys."""
    async with runtime.db.tx() as conn:
        rows = await scopes.list_keys(conn, user_id=user_id, app_id=app_id, offset=offset, limit=limit)
    return [KeyInfo.model_validate(row) for row in rows]


@router.post("/keys/{key_id}/revoke", response_model=KeyInfo, responses=errors(401, 404, 422))
async def revoke_key(key_id: uuid.UUID, runtime: RuntimeDep) -> KeyInfo:
    """Revoke the key: from now on it answers 401 on every replica. Revoking it again changes nothing."""
    async with runtime.db.tx() as conn:
        return KeyInfo.model_validate(await scopes.revoke_key(conn, key_id))
