"""The agent directory: a list comes a page at a time as summaries, and an edit lands only on the
agent as its owner read it."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from persistence import agents
from persistence.db import Database
from persistence.errors import Conflict
from persistence.records import Scope
from tests.actors.helpers import eventually
from tests.persistence.helpers import fetch_all, scalar


async def test_a_list_is_a_page_of_summaries(db: Database) -> None:
    app = f"app-{uuid.uuid4().hex[:8]}"
    owner, colleague = Scope("owner", app), Scope("colleague", app)
    async with db.tx() as conn:
        for name in ("a", "b", "c"):
            await agents.create_agent(conn, owner, {"agent_id": name, "name": name.upper(), "model": "canopy/scripted",
                                                    "shared": name != "b", "description": name * 600,
                                                    "instructions": "secret plan " * 1000})
        first = await agents.list_agents(conn, colleague, offset=0, limit=1)
        rest = await agents.list_agents(conn, colleague, offset=1, limit=10)
    assert [row["agent_id"] for row in first + rest] == ["a", "c"]  # b is the owner's own
    assert all("instructions" not in row for row in first + rest)
    assert [(len(row["description"]), row["description_truncated"]) for row in first + rest] == \
        [(agents.DESCRIPTION_PREVIEW, True)] * 2
    async with db.tx() as conn:
        whole = await agents.get_agent(conn, colleague, "a")
    assert len(whole["description"]) == 600 and whole["instructions"].startswith("secret plan")


async def test_an_edit_made_meanwhile_is_not_overwritten(db: Database) -> None:
    # Two edits of the owner read the same agent; the first commits while the second waits for the
    # row. The second wrote every field as it had read them, undoing the first: now it is refused.
    scope = Scope("owner", f"app-{uuid.uuid4().hex[:8]}")
    async with db.tx() as conn:
        await agents.create_agent(conn, scope, {"agent_id": "x", "name": "Mine", "model": "canopy/scripted"})

    async def second() -> None:
        async with db.tx() as conn:
            await agents.update_agent(conn, scope, "x", {"instructions": "be brief"})

    async with db.tx() as first:
        await agents.update_agent(first, scope, "x", {"name": "Renamed"})
        waiting = asyncio.create_task(second())
        # The second edit has read the agent and waits for its row.
        await eventually(lambda: scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                            "AND wait_event_type = 'Lock'"), timeout=30, every=0.02)
    with pytest.raises(Conflict, match="changed while it was being edited"):
        await waiting
    assert await fetch_all(db, "SELECT name, instructions FROM agents WHERE app_id = %s", (scope.app_id,)) == \
        [{"name": "Renamed", "instructions": ""}]
