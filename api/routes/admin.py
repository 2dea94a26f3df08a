"""Operator routes: the admin token (``CANOPY_ADMIN_TOKEN``) creates API keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, status

from api.auth import require_admin
from api.deps import RuntimeDep, errors
from api.schemas import KeyCreate, KeyCreated
from persistence.records import Scope

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])


@router.post("/keys", status_code=status.HTTP_201_CREATED, response_model=KeyCreated,
             responses=errors(401, 413, 422))
async def create_key(body: KeyCreate, runtime: RuntimeDep) -> KeyCreated:
    """A new API key for the scope (user_id, app_id). The key is shown once; only its hash is kept."""
    api_key = await runtime.create_api_key(Scope(body.user_id, body.app_id))
    return KeyCreated(api_key=api_key, user_id=body.user_id, app_id=body.app_id)
