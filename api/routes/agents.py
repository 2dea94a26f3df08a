"""The agent directory: an agent is visible to its owner, and to every user of its app when shared."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse

from api.auth import ScopeDep
from api.deps import COMMON, Offset, QueryInt, RuntimeDep, errors, link_next, pages
from api.schemas import AGENT_ID_PATTERN, SCOPE_ID_PATTERN, Agent, AgentCreate, AgentSummary, AgentUpdate
from api.writes import IdempotencyKey, respond_to_write
from persistence import agents
from persistence.errors import InvalidArgument

router = APIRouter(prefix="/agents", tags=["agents"])
AgentIdPath = Annotated[str, Path(pattern=AGENT_ID_PATTERN, description="The agent's slug.")]


@router.get("", response_model=list[AgentSummary], responses=pages("agents"))
async def list_agents(caller: ScopeDep, runtime: RuntimeDep, request: Request, response: Response,
                      offset: Offset = 0,
                      limit: Annotated[QueryInt, Query(ge=1, le=100)] = 100,
                      after: Annotated[str | None, Query(
                          pattern=AGENT_ID_PATTERN, description="Only agents listed after this one (the last of "
                          "the previous page, with after_owner): pages that agents made or deleted meanwhile do "
                          "not shift.")] = None,
                      after_owner: Annotated[str | None, Query(
                          pattern=SCOPE_ID_PATTERN, description="The owner of the agent `after` names.")] = None,
                      ) -> list[AgentSummary]:
    """A page of the agents the caller may run, by id (the caller's own first among agents of one id),
    as summaries. A full page has a ``Link: <…>; rel="next"`` header: the next page, after its last
    agent."""
    if (after is None) != (after_owner is None):
        raise InvalidArgument("after and after_owner go together: the id and owner of the last agent read")
    async with runtime.db.tx() as conn:
        rows = await agents.list_agents(conn, caller, offset=offset, limit=limit,
                                        after=(after, after_owner) if after and after_owner else None)
    if len(rows) == limit:
        link_next(request, response, "agents", after=rows[-1]["agent_id"], after_owner=rows[-1]["owner_user_id"],
                  limit=limit)
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
