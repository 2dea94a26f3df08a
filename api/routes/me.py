"""Who the caller is: the scope (user, app) its API key maps to. The UI shows it, so a browser that
took a key from a link ("#key=…") says whose key it now uses."""

from __future__ import annotations

from fastapi import APIRouter

from api.auth import ScopeDep
from api.deps import COMMON, errors
from api.schemas import Identity

router = APIRouter(prefix="/me", tags=["me"])


@router.get("", response_model=Identity, responses=errors(*COMMON))
async def who_am_i(caller: ScopeDep) -> Identity:
    return Identity(user_id=caller.user_id, app_id=caller.app_id)
