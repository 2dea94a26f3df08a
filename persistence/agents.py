"""The agent directory. An agent belongs to an app; it is visible to its owner, and to
every user of the app when ``shared``.

An agent's id names it among its owner's agents, and a shared agent's id among the app's shared
ones. Another user's private agent stays out of sight, its id included: taking that id is no
conflict, as a refusal would tell that it exists. So a user may see two agents of one id (their
own and a colleague's shared one, shared later); their own is the one the id reaches."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from psycopg.errors import UniqueViolation
from psycopg.types.json import Jsonb

from persistence.db import Connection
from persistence.errors import Conflict, InvalidArgument, NotFound, shown
from persistence.records import Row, Scope
from persistence.usage import check_budget

_COLUMNS = "agent_id, name, description, model, instructions, tools, approval_mode, shared, owner_user_id, " \
    "created_at, updated_at, compact_at_tokens, budget, api_base, api_key_ref"
_VISIBLE = "app_id = %(app_id)s AND (owner_user_id = %(user_id)s OR shared)"
# An owner's edit, of the version it read (``read_at``).
_UPDATE = f"""UPDATE agents SET name = %(name)s, description = %(description)s, model = %(model)s,
                   instructions = %(instructions)s, tools = %(tools)s, approval_mode = %(approval_mode)s,
                   shared = %(shared)s, compact_at_tokens = %(compact_at_tokens)s, budget = %(budget)s,
                   api_base = %(api_base)s, api_key_ref = %(api_key_ref)s, updated_at = now()
            WHERE app_id = %(app_id)s AND agent_id = %(agent_id)s AND owner_user_id = %(user_id)s
              AND updated_at = %(read_at)s
            RETURNING {_COLUMNS}"""
# How much of an agent's description a list shows.
DESCRIPTION_PREVIEW = 500
EDITABLE_FIELDS = ("name", "description", "model", "instructions", "tools", "approval_mode", "shared",
                   "compact_at_tokens", "budget", "api_base", "api_key_ref")
# What decides where an agent's model calls go and with which key: checked together (actors/runtime.py).
ENDPOINT_FIELDS = ("model", "api_base", "api_key_ref")
# The NAME of a key (an environment variable or a secret file), never a key: the database holds no key.
API_KEY_REF_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"
API_BASE_PATTERN = r"^https?://[^\s*\x00]+$"
API_BASE_MAX_CHARS = 2000


def check_endpoint(api_base: str | None, api_key_ref: str | None) -> None:
    """The shape of an agent's endpoint fields; whether the gateway can use them is the gateway's call."""
    if api_base is not None and (len(api_base) > API_BASE_MAX_CHARS or not re.fullmatch(API_BASE_PATTERN, api_base)):
        raise InvalidArgument(f"api_base must be an http:// or https:// URL of at most {API_BASE_MAX_CHARS} "
                              "characters, without spaces or '*'")
    if api_base is not None and "@" in _netloc(api_base):
        raise InvalidArgument("api_base must not hold credentials (user@host): the key goes by api_key_ref")
    if api_key_ref is not None and not re.fullmatch(API_KEY_REF_PATTERN, api_key_ref):
        raise InvalidArgument("api_key_ref is the NAME of an environment variable or secret file that holds the key "
                              "(upper-case letters, digits and '_', e.g. OPENAI_API_KEY), never the key itself")


def _netloc(url: str) -> str:
    try:
        return urllib.parse.urlsplit(url).netloc
    except ValueError:  # e.g. an unclosed "[" of an IPv6 host
        raise InvalidArgument(f"api_base {url!r} is not a URL") from None


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
        "api_base": agent["api_base"],
        "api_key_ref": agent["api_key_ref"],
    }


def _stored_budget(budget: dict[str, Any] | None) -> Jsonb | None:
    """An agent's default budget as stored: its limits that are set, checked; None for none."""
    limits = {name: value for name, value in check_budget(budget).items() if value is not None}
    return Jsonb(limits) if limits else None


async def create_agent(conn: Connection, scope: Scope, fields: dict[str, Any]) -> Row:
    check_endpoint(fields.get("api_base"), fields.get("api_key_ref"))
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
        "api_base": fields.get("api_base"),
        "api_key_ref": fields.get("api_key_ref"),
    }
    # An id the user can see already is taken for them: their own, or a shared one.
    cur = await conn.execute(
        f"""INSERT INTO agents (app_id, agent_id, owner_user_id, name, description, model, instructions,
                                tools, approval_mode, shared, compact_at_tokens, budget, api_base, api_key_ref)
            SELECT %(app_id)s, %(agent_id)s, %(owner_user_id)s, %(name)s, %(description)s, %(model)s,
                   %(instructions)s, %(tools)s, %(approval_mode)s, %(shared)s, %(compact_at_tokens)s, %(budget)s,
                   %(api_base)s, %(api_key_ref)s
            WHERE NOT EXISTS (SELECT 1 FROM agents WHERE app_id = %(app_id)s AND agent_id = %(agent_id)s
                                                     AND (owner_user_id = %(owner_user_id)s OR shared))
            ON CONFLICT DO NOTHING
            RETURNING {_COLUMNS}""",
        params,
    )
    row = await cur.fetchone()
    if row is None:
        raise Conflict(f"an agent with id {fields['agent_id']!r} is already yours or shared in this app")
    return row


async def get_agent(conn: Connection, scope: Scope, agent_id: str) -> Row:
    """An agent the user may run; any other agent is reported as absent."""
    cur = await conn.execute(
        f"""SELECT {_COLUMNS} FROM agents WHERE {_VISIBLE} AND agent_id = %(agent_id)s
            ORDER BY owner_user_id <> %(user_id)s LIMIT 1""",
        {"app_id": scope.app_id, "user_id": scope.user_id, "agent_id": agent_id},
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no agent {shown(agent_id)} that you may run")
    return row


async def list_agents(conn: Connection, scope: Scope, *, offset: int, limit: int,
                      after: tuple[str, str] | None = None) -> list[Row]:
    """A page of the agents the user may run, by id (the user's own first among agents of one id), as
    summaries: no instructions, and the first DESCRIPTION_PREVIEW characters of the description (the
    whole agent is one ``get_agent`` away). Every user of an app sees its shared agents, so a page
    must not grow with what others wrote. ``after`` (an agent's id and owner, the last of the page
    before) continues the list after it, wherever agents made or deleted since have moved it."""
    after_id, after_owner = after or (None, None)
    cur = await conn.execute(
        f"""SELECT agent_id, name, left(description, {DESCRIPTION_PREVIEW}) AS description,
                   length(description) > {DESCRIPTION_PREVIEW} AS description_truncated, model, approval_mode,
                   shared, owner_user_id, updated_at
            FROM agents WHERE {_VISIBLE}
              AND (%(after_id)s::text IS NULL
                   OR (agent_id, owner_user_id <> %(user_id)s, owner_user_id)
                      > (%(after_id)s::text, %(after_owner)s::text <> %(user_id)s, %(after_owner)s::text))
            ORDER BY agent_id, owner_user_id <> %(user_id)s, owner_user_id OFFSET %(offset)s LIMIT %(limit)s""",
        {"app_id": scope.app_id, "user_id": scope.user_id, "offset": offset, "limit": limit,
         "after_id": after_id, "after_owner": after_owner},
    )
    return await cur.fetchall()


async def delete_agent(conn: Connection, scope: Scope, agent_id: str) -> None:
    """Only the owner deletes an agent; sessions created from it keep their frozen copy and run on.
    Its id is free again (a session's ``agent_id`` is the name it was made from)."""
    cur = await conn.execute(
        "DELETE FROM agents WHERE app_id = %(app_id)s AND agent_id = %(agent_id)s AND owner_user_id = %(user_id)s "
        "RETURNING agent_id",
        {"app_id": scope.app_id, "agent_id": agent_id, "user_id": scope.user_id},
    )
    if await cur.fetchone() is None:
        raise NotFound(f"no agent {agent_id!r} that you own")


async def get_own_agent(conn: Connection, scope: Scope, agent_id: str) -> Row:
    """The caller's own agent: another user's, shared or not, is not found (only the owner edits)."""
    agent = await get_agent(conn, scope, agent_id)
    if agent["owner_user_id"] != scope.user_id:
        raise NotFound(f"no agent {agent_id!r} that you own")
    return agent


async def update_agent(conn: Connection, scope: Scope, agent_id: str, changes: dict[str, Any],
                       checked_endpoint: dict[str, Any] | None = None) -> Row:
    """Only the owner edits an agent; sessions created from it keep their frozen copy.

    ``checked_endpoint``: the model, api_base and api_key_ref the caller had checked; an agent
    whose merged endpoint differs from it (another edit came in between) is a Conflict."""
    current = await get_own_agent(conn, scope, agent_id)
    merged = {field: changes.get(field, current[field]) for field in EDITABLE_FIELDS}
    check_endpoint(merged["api_base"], merged["api_key_ref"])
    if checked_endpoint is not None and {f: merged[f] for f in ENDPOINT_FIELDS} != checked_endpoint:
        raise Conflict(f"agent {agent_id!r} changed while its model was being checked; send the edit again")
    merged["tools"] = Jsonb(merged["tools"])
    merged["budget"] = _stored_budget(merged["budget"])
    try:
        cur = await conn.execute(_UPDATE, {**merged, "app_id": scope.app_id, "agent_id": agent_id,
                                           "user_id": scope.user_id, "read_at": current["updated_at"]})
    except UniqueViolation:  # made shared beside another shared agent of its id, which the user sees
        raise Conflict(f"another shared agent of this app has id {agent_id!r}") from None
    row = await cur.fetchone()
    if row is None:  # deleted, or replaced or edited by another request, since it was read
        raise Conflict(f"agent {agent_id!r} changed while it was being edited; send the edit again")
    return row
