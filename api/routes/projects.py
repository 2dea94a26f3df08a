"""Projects: named working directories. The workdir is derived, never chosen by a caller."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, RuntimeDep, errors
from api.schemas import Project, ProjectCreate
from api.writes import IdempotencyKey, respond_to_write
from persistence import projects

router = APIRouter(prefix="/projects", tags=["projects"])


@router.get("", response_model=list[Project], responses=errors(*COMMON))
async def list_projects(caller: ScopeDep, runtime: RuntimeDep) -> list[Project]:
    async with runtime.db.tx() as conn:
        rows = await projects.list_projects(conn, caller)
    return [Project.model_validate(row) for row in rows]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Project, responses=errors(*COMMON, 413))
async def create_project(body: ProjectCreate, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                         idempotency_key: IdempotencyKey = None) -> JSONResponse:
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_201_CREATED,
        lambda hook: runtime.create_project(caller, body.name, in_tx=hook), Project.model_validate)


@router.delete("/{project_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(*COMMON, 404, 409))
async def delete_project(project_id: uuid.UUID, caller: ScopeDep, runtime: RuntimeDep) -> None:
    """Only a project without conversations (409 otherwise: their history is kept); its place in the
    scope's quota is free again. It has no workdir to remove: only a conversation's tools make one."""
    async with runtime.db.tx() as conn:
        await projects.delete_project(conn, caller, project_id)
