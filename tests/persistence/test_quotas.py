"""A scope's quota of projects, agents and schedules: refused past the limit, never overshot by
concurrent creates, counted per (user, app), ended schedules not counted."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from persistence import agents, projects, quotas, schedules, trees
from persistence.db import Database
from persistence.errors import LimitExceeded
from persistence.records import Scope
from tests.persistence.helpers import make_tree, scalar


async def _create_project(db: Database, scope: Scope, name: str, limit: int) -> None:
    async with db.tx() as conn:
        await quotas.check_room(conn, scope, "projects", limit)
        await asyncio.sleep(0.05)  # the window a count without the lock would lose
        await projects.create_project(conn, scope, name, Path("/tmp/projects"))


async def test_concurrent_creates_cannot_overshoot_the_quota(db: Database) -> None:
    scope = Scope(f"quota-{uuid.uuid4().hex[:8]}", "app")

    outcomes = await asyncio.gather(*(_create_project(db, scope, f"p{i}", 3) for i in range(6)),
                                    return_exceptions=True)

    refused = [outcome for outcome in outcomes if isinstance(outcome, LimitExceeded)]
    assert len(refused) == 3 and outcomes.count(None) == 3, outcomes
    assert "CANOPY_MAX_PROJECTS_PER_SCOPE" in str(refused[0]) and "already has 3 projects" in str(refused[0])
    assert await scalar(db, "SELECT count(*) FROM projects WHERE user_id = %s", (scope.user_id,)) == 3
    other = Scope(scope.user_id, "another-app")  # a quota is per (user, app)
    await _create_project(db, other, "elsewhere", 3)



async def test_scopes_whose_ids_join_alike_do_not_share_a_lock(db: Database) -> None:
    """Scope ids may hold ':' (api.schemas.SCOPE_ID_PATTERN): the locks of ("a:b", "c") and
    ("a", "b:c") were one, so one tenant's creates waited for another's."""
    tag = uuid.uuid4().hex[:8]
    first, second = Scope(f"{tag}:b", "c"), Scope(tag, "b:c")
    async with db.tx() as holder:
        await quotas.hold(holder, first, "projects")
        async with db.tx() as conn:
            await conn.execute("SET LOCAL lock_timeout = '200ms'")
            await quotas.hold(conn, second, "projects")  # waited for the holder, and timed out
            await projects.create_project(conn, second, "p", Path("/tmp/projects"))
    assert await scalar(db, "SELECT count(*) FROM projects WHERE user_id = %s", (second.user_id,)) == 1

async def test_agents_are_counted_by_owner_within_the_app(db: Database) -> None:
    app = f"app-{uuid.uuid4().hex[:8]}"
    owner, colleague = Scope("owner", app), Scope("colleague", app)
    async with db.tx() as conn:
        await agents.create_agent(conn, owner, {"agent_id": "a1", "name": "A", "model": "canopy/scripted"})
        await quotas.check_room(conn, colleague, "agents", 1)  # the owner's agent is not the colleague's
    async with db.tx() as conn:
        with pytest.raises(LimitExceeded, match="CANOPY_MAX_AGENTS_PER_SCOPE"):
            await quotas.check_room(conn, owner, "agents", 1)


async def test_a_deleted_schedule_frees_its_place(db: Database) -> None:
    scope = Scope(f"quota-{uuid.uuid4().hex[:8]}", "app")
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        await quotas.check_room(conn, scope, "schedules", 1)
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(None, 60.0), "tick")
    async with db.tx() as conn:
        with pytest.raises(LimitExceeded, match="delete one first"):
            await quotas.check_room(conn, scope, "schedules", 1)
    async with db.tx() as conn:
        await schedules.delete_schedule(conn, scope, tree.root_id, made["schedule_id"])
        await quotas.check_room(conn, scope, "schedules", 1)


async def test_an_archived_conversation_frees_its_place(db: Database) -> None:
    scope = Scope(f"quota-{uuid.uuid4().hex[:8]}", "app")
    tree = await make_tree(db, scope)
    await make_tree(db, Scope(scope.user_id, "another-app"))  # a quota is per (user, app)
    async with db.tx() as conn:
        with pytest.raises(LimitExceeded, match=r"already has 1 conversations .*MAX_ROOTS_PER_SCOPE.*archive one"):
            await quotas.check_room(conn, scope, "roots", 1)
    async with db.tx() as conn:
        await trees.archive_root(conn, scope, tree.root_id)
        await quotas.check_room(conn, scope, "roots", 1)
