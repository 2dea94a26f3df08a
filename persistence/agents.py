"""The agent directory. An agent belongs to an app; it is visible to its owner, and to
every user of the app when ``shared``."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from persistence.db import Connection
from persistence.errors import Conflict, NotFound
from persistence.records import Row, Scope
from persistence.usage import check_budget

_COLUMNS = "agent_id, name, description, model, instructions, tools, approval_mode, shared, owner_user_id, " \
    "created_at, updated_at, compact_at_tokens, budget"
_VISIBLE = "app_id = %(app_id)s AND (owner_user_id = %(user_id)s OR shared)"
EDITABLE_FIELDS = ("name", "description", "model", "instructions", "tools", "approval_mode", "shared",
                   "compact_at_tokens", "budget")


def frozen_config(agent: Row) -> dict[str, Any]:
    """The part of an agent a session keeps for its whole life."""
    return {
        "agent_id": agent["agent_id"],
        "name": agent["name"],
        "model": agent["model"],
        "instructions": agent["instructions"],
        "tools": list(agent["tools"]),
        "approval_mode": agent["approval_mode"],
        "compact_at_tokens": agent["compact_at_tokens"],
        # The budget a tree it starts gets when its creator names none (persistence/usage.py).
        "budget": agent["budget"],
    }


def _stored_budget(budget: dict[str, Any] | None) -> Jsonb | None:
    """An agent's default budget as stored: its limits that are set, checked; None for none."""
    limits = {name: value for name, value in check_budget(budget).items() if value is not None}
    return Jsonb(limits) if limits else None


async def create_agent(conn: Connection, scope: Scope, fields: dict[str, Any]) -> Row:
    params = {
        "app_id": scope.app_id,
        "owner_user_id": scope.user_id,
        "agent_id": fields["agent_id"],
        "name": fields["name"],
        "description": fields.get("description", ""),
        "model": fields["model"],
        "instructions": fields.get("instructions", ""),
        "tools": Jsonb(fields.get("tools", [])),
        "approval_mode": fields.get("approval_mode", "auto"),
        "shared": fields.get("shared", False),
        "compact_at_tokens": fields.get("compact_at_tokens"),
        "budget": _stored_budget(fields.get("budget")),
    }
    cur = await conn.execute(
        f"""INSERT INTO agents (app_id, agent_id, owner_user_id, name, description, model, instructions,
                                tools, approval_mode, shared, compact_at_tokens, budget)
            VALUES (%(app_id)s, %(agent_id)s, %(owner_user_id)s, %(name)s, %(description)s, %(model)s,
                    %(instructions)s, %(tools)s, %(approval_mode)s, %(shared)s, %(compact_at_tokens)s, %(budget)s)
            ON CONFLICT DO NOTHING
            RETURNING {_COLUMNS}""",
        params,
    )
    row = await cur.fetchone()
    if row is None:
        raise Conflict(f"an agent with id {fields['agent_id']!r} already exists in this app")
    return row


async def get_agent(conn: Connection, scope: Scope, agent_id: str) -> Row:
    """An agent the user may run; any other agent is reported as absent."""
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM agents WHERE {_VISIBLE} AND agent_id = %(agent_id)s",
        {"app_id": scope.app_id, "user_id": scope.user_id, "agent_id": agent_id},
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no agent {agent_id!r} that you may run")
    return row


async def list_agents(conn: Connection, scope: Scope) -> list[Row]:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM agents WHERE {_VISIBLE} ORDER BY agent_id",
        {"app_id": scope.app_id, "user_id": scope.user_id},
    )
    return await cur.fetchall()


async def update_agent(conn: Connection, scope: Scope, agent_id: str, changes: dict[str, Any]) -> Row:
    """Only the owner edits an agent; sessions created from it keep their frozen copy."""
    current = await get_agent(conn, scope, agent_id)
    if current["owner_user_id"] != scope.user_id:
        raise NotFound(f"no agent {agent_id!r} that you own")
    merged = {field: changes.get(field, current[field]) for field in EDITABLE_FIELDS}
    merged["tools"] = Jsonb(merged["tools"])
    merged["budget"] = _stored_budget(merged["budget"])
    cur = await conn.execute(
        f"""UPDATE agents SET name = %(name)s, description = %(description)s, model = %(model)s,
                   instructions = %(instructions)s, tools = %(tools)s, approval_mode = %(approval_mode)s,
                   shared = %(shared)s, compact_at_tokens = %(compact_at_tokens)s, budget = %(budget)s,
                   updated_at = now()
            WHERE app_id = %(app_id)s AND agent_id = %(agent_id)s
            RETURNING {_COLUMNS}""",
        {**merged, "app_id": scope.app_id, "agent_id": agent_id},
    )
    row = await cur.fetchone()
    assert row is not None
    return row
