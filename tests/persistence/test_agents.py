"""The agent directory: a list comes a page at a time as summaries, an edit lands only on the agent
as its owner read it, and another user's private agent does not take an id."""

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


async def test_an_id_another_user_holds_privately_is_no_conflict(db: Database) -> None:
    # Ids were unique in the whole app: a refused create (409) told a user that a colleague had a
    # private agent of that id, which reading it (404) never tells. An id is now taken for a user
    # only by an agent they can see: their own, or a shared one.
    app = f"app-{uuid.uuid4().hex[:8]}"
    owner, colleague, third = Scope("owner", app), Scope("colleague", app), Scope("third", app)

    def plan(name: str, shared: bool = False) -> dict[str, object]:
        return {"agent_id": "plan", "name": name, "model": "canopy/scripted", "shared": shared}

    async with db.tx() as conn:
        await agents.create_agent(conn, owner, plan("Owner's"))
        await agents.create_agent(conn, colleague, plan("Colleague's"))
        assert (await agents.get_agent(conn, owner, "plan"))["name"] == "Owner's"
        assert (await agents.get_agent(conn, colleague, "plan"))["name"] == "Colleague's"
        # Shared later, the owner's reaches everybody else; the colleague sees both and reaches theirs.
        await agents.update_agent(conn, owner, "plan", {"shared": True})
        assert (await agents.get_agent(conn, colleague, "plan"))["name"] == "Colleague's"
        assert (await agents.get_agent(conn, third, "plan"))["name"] == "Owner's"
        listed = await agents.list_agents(conn, colleague, offset=0, limit=10)
        assert [(row["agent_id"], row["owner_user_id"]) for row in listed] == [("plan", "colleague"), ("plan", "owner")]
    for scope, shared in ((third, False), (third, True), (owner, False)):  # an id they see
        with pytest.raises(Conflict, match="already yours or shared"):
            async with db.tx() as conn:
                await agents.create_agent(conn, scope, plan("Again", shared))
    with pytest.raises(Conflict, match="another shared agent of this app has id 'plan'"):
        async with db.tx() as conn:
            await agents.update_agent(conn, colleague, "plan", {"shared": True})
    assert await fetch_all(db, "SELECT owner_user_id, name, shared FROM agents WHERE app_id = %s "
                               "ORDER BY owner_user_id", (app,)) == [
        {"owner_user_id": "colleague", "name": "Colleague's", "shared": False},
        {"owner_user_id": "owner", "name": "Owner's", "shared": True}]
