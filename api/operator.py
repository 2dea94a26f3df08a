"""Operator commands that talk to the database directly (no Ray needed): keys, agents, sessions, trees,
traces."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rich.console import Console

from actors.toolbox import check_tool_names
from api.trace import trace_events
from api.views import agents_table, keys_table, sessions_table, tree_table
from persistence import agents, scopes, sessions, timeline, trees
from persistence.db import Connection, Database, resolve_database_url
from persistence.migrations import ensure_schema
from persistence.records import Row, Scope
from persistence.settings import get_settings

T = TypeVar("T")
_PAGE = 1000


async def in_database(work: Callable[[Connection], Awaitable[T]]) -> T:
    """One transaction on the configured database (the embedded one by default)."""
    url = resolve_database_url()
    ensure_schema(url)
    db = await Database.connect(url, max_size=1)
    try:
        async with db.tx() as conn:
            return await work(conn)
    finally:
        await db.close()


async def create_key(scope: Scope, expires_in_seconds: float | None = None) -> tuple[str, Row]:
    return await in_database(lambda conn: scopes.issue_key(conn, scope, expires_in_seconds=expires_in_seconds))


async def _every_page(read: Callable[[Connection, int, int], Awaitable[list[Row]]]) -> list[Row]:
    """Every row of a list a terminal shows whole, read a page (offset, limit) at a time."""
    async def every_row(conn: Connection) -> list[Row]:
        found: list[Row] = []
        while page := await read(conn, len(found), _PAGE):
            found += page
        return found

    return await in_database(every_row)


async def list_keys(console: Console, *, user_id: str | None, app_id: str | None) -> None:
    console.print(keys_table(await _every_page(
        lambda conn, offset, limit: scopes.list_keys(conn, user_id=user_id, app_id=app_id, offset=offset,
                                                     limit=limit))))


async def revoke_key(key_id: uuid.UUID) -> Row:
    return await in_database(lambda conn: scopes.revoke_key(conn, key_id))


async def list_agents(scope: Scope, console: Console) -> None:
    console.print(agents_table(await _every_page(
        lambda conn, offset, limit: agents.list_agents(conn, scope, offset=offset, limit=limit))))


async def create_agent(scope: Scope, fields: dict[str, Any], console: Console) -> None:
    """Checked as the API checks it, by a ModelGateway of this process's own (no Ray here) that sees
    what the runtime's gateway would: the secrets directory and this environment's provider variables."""
    from actors.gateways import gateway_here  # litellm and Ray: only this command pays for them
    from actors.runtime import require_usable_model

    check_tool_names(fields.get("tools") or [])
    settings = get_settings()
    fields = {**fields, "model": fields.get("model") or settings.default_model}
    await require_usable_model(gateway_here(settings).check_model, fields)
    agent = await in_database(lambda conn: agents.create_agent(conn, scope, fields))
    console.print(agents_table([agent]))


async def list_sessions(scope: Scope, console: Console, *, limit: int, include_archived: bool) -> None:
    found = await in_database(lambda conn: sessions.list_roots(
        conn, scope, project_id=None, offset=0, limit=limit, include_archived=include_archived))
    console.print(sessions_table(found))


async def show_tree(scope: Scope, tree_id: uuid.UUID, console: Console) -> None:
    summary = await in_database(lambda conn: trees.tree_summary(conn, scope, tree_id))
    console.print(tree_table(summary))


async def tree_trace(scope: Scope, tree_id: uuid.UUID) -> dict[str, Any]:
    """The tree's whole timeline as Chrome trace-event JSON (a dict ready for ``json.dump``)."""
    return trace_events(await in_database(lambda conn: timeline.timeline(conn, scope, tree_id)))
