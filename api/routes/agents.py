"""The agent directory: an agent is visible to its owner, and to every user of its app when shared."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, Offset, RuntimeDep, errors
from api.schemas import Agent, AgentCreate, AgentSummary, AgentUpdate
from api.writes import IdempotencyKey, respond_to_write
from persistence import agents

router = APIRouter(prefix="/agents", tags=["agents"])
AgentIdPath = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$", description="The agent's slug.")]


@router.get("", response_model=list[AgentSummary], responses=errors(*COMMON))
async def list_agents(caller: ScopeDep, runtime: RuntimeDep,
                      offset: Offset = 0,
                      limit: Annotated[int, Query(ge=1, le=100)] = 100) -> list[AgentSummary]:
    """A page of the agents the caller may run, by id, as summaries (a shorter page: the last)."""
    async with runtime.db.tx() as conn:
        rows = await agents.list_agents(conn, caller, offset=offset, limit=limit)
    return [AgentSummary.model_validate(row) for row in rows]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Agent,
             responses=errors(*COMMON, 409, 413))
async def create_agent(body: AgentCreate, caller: ScopeDep, runtime: RuntimeDep, request: Request,
                       idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """422, with nothing written, when the model gateway cannot use the model with its api_base and
    api_key_ref: the sentence names the missing variable or key."""
    fields = body.model_dump()
    fields["model"] = body.model or runtime.settings.default_model
    return await respond_to_write(
        request, caller, idempotency_key, body, status.HTTP_201_CREATED,
        lambda hook: runtime.create_agent(caller, fields, in_tx=hook), Agent.model_validate)


@router.get("/{agent_id}", response_model=Agent, responses=errors(*COMMON, 404))
async def get_agent(agent_id: AgentIdPath, caller: ScopeDep, runtime: RuntimeDep) -> Agent:
    async with runtime.db.tx() as conn:
        return Agent.model_validate(await agents.get_agent(conn, caller, agent_id))


@router.patch("/{agent_id}", response_model=Agent, responses=errors(*COMMON, 404, 409, 413))
async def update_agent(agent_id: AgentIdPath, body: AgentUpdate, caller: ScopeDep, runtime: RuntimeDep) -> Agent:
    """Only the owner edits. Sessions already created from the agent keep their frozen copy. A new
    model, api_base or api_key_ref is checked as at creation (422, nothing changed). 409 when
    another edit changed the agent meanwhile: nothing changed, send the edit again."""
    changes = body.model_dump(exclude_unset=True)
    return Agent.model_validate(await runtime.update_agent(caller, agent_id, changes))


@router.delete("/{agent_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(*COMMON, 404))
async def delete_agent(agent_id: AgentIdPath, caller: ScopeDep, runtime: RuntimeDep) -> None:
    """Only the owner deletes (another user's agent is a 404, shared or not). Sessions created from it
    keep their frozen copy and run on; the id is free again in the app."""
    async with runtime.db.tx() as conn:
        await agents.delete_agent(conn, caller, agent_id)
