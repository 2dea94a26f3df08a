"""Projects: only one without conversations is deleted, never another scope's, and a tree being made
in a project while it is deleted either lands (the delete is refused) or is told the project is gone."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from persistence import projects, sessions
from persistence.db import Database
from persistence.errors import Conflict, NotFound
from persistence.records import Scope
from tests.persistence.helpers import AGENT_CONFIG, WORKDIR_ROOT, make_tree, scalar


async def _new_project(db: Database, scope: Scope) -> uuid.UUID:
    async with db.tx() as conn:
        return (await projects.create_project(conn, scope, "p", WORKDIR_ROOT))["project_id"]


async def _delete(db: Database, scope: Scope, project_id: uuid.UUID) -> None:
    async with db.tx() as conn:
        await projects.delete_project(conn, scope, project_id)


async def _counts(db: Database, project_id: uuid.UUID) -> tuple[int, int]:
    return (await scalar(db, "SELECT count(*) FROM projects WHERE project_id = %s", (project_id,)),
            await scalar(db, "SELECT count(*) FROM trees WHERE project_id = %s", (project_id,)))


def _scope() -> Scope:
    return Scope(f"projects-{uuid.uuid4().hex[:8]}", "app")


async def test_a_project_without_conversations_is_deleted_and_no_one_elses(db: Database) -> None:
    scope = _scope()
    project_id = await _new_project(db, scope)

    for other in (Scope(scope.user_id, "another-app"), Scope("another-user", scope.app_id)):
        with pytest.raises(NotFound):
            await _delete(db, other, project_id)
    assert await _counts(db, project_id) == (1, 0)

    await _delete(db, scope, project_id)
    assert await _counts(db, project_id) == (0, 0)
    with pytest.raises(NotFound):
        await _delete(db, scope, project_id)


async def test_a_project_holding_a_conversation_is_kept_with_it(db: Database) -> None:
    scope = _scope()
    tree = await make_tree(db, scope)

    with pytest.raises(Conflict, match="holds 1 conversation"):
        await _delete(db, scope, tree.project_id)

    assert await _counts(db, tree.project_id) == (1, 1)


async def _make_tree_in(db: Database, scope: Scope, project_id: uuid.UUID | None) -> uuid.UUID:
    """What ``Runtime.create_root`` does: the project (given, or the scope's default), then the tree."""
    async with db.tx() as conn:
        if project_id is None:
            project = await projects.default_project(conn, scope, WORKDIR_ROOT)
        else:
            project = await projects.get_project(conn, scope, project_id, for_new_tree=True)
        await sessions.create_root(conn, scope, project_id=project["project_id"], agent_id=None,
                                   agent_config=AGENT_CONFIG, slot_limit=4, title="meanwhile")
        return project["project_id"]


@pytest.mark.parametrize("by_default", [False, True])
async def test_a_tree_made_first_keeps_its_project(db: Database, by_default: bool) -> None:
    scope = _scope()
    project_id = await _new_project(db, scope)
    async with db.tx() as conn:
        if by_default:
            assert (await projects.default_project(conn, scope, WORKDIR_ROOT))["project_id"] == project_id
        else:
            await projects.get_project(conn, scope, project_id, for_new_tree=True)
        deleting = asyncio.create_task(_delete(db, scope, project_id))
        await asyncio.sleep(0.3)  # the delete is under way, and waits for this transaction
        await sessions.create_root(conn, scope, project_id=project_id, agent_id=None, agent_config=AGENT_CONFIG,
                                   slot_limit=4, title="first")

    with pytest.raises(Conflict):
        await deleting
    assert await _counts(db, project_id) == (1, 1)


async def test_with_its_default_project_deleted_a_scope_uses_the_next_oldest(db: Database) -> None:
    scope = _scope()
    oldest = await _new_project(db, scope)
    await _new_project(db, _scope())  # another scope's, older than the next: never this scope's default
    next_oldest = await _new_project(db, scope)

    await _delete(db, scope, oldest)

    assert await _make_tree_in(db, scope, None) == next_oldest


async def test_first_uses_at_once_make_one_default_project(db: Database) -> None:
    scope = _scope()

    made_in = await asyncio.gather(*(_make_tree_in(db, scope, None) for _ in range(4)))

    assert len(set(made_in)) == 1
    assert await scalar(db, "SELECT count(*) FROM projects WHERE user_id = %s AND app_id = %s",
                        (scope.user_id, scope.app_id)) == 1


@pytest.mark.parametrize("by_default", [False, True])
async def test_a_tree_made_after_the_delete_is_told_or_gets_a_new_default(db: Database, by_default: bool) -> None:
    scope = _scope()
    project_id = await _new_project(db, scope)
    async with db.tx() as conn:
        await projects.delete_project(conn, scope, project_id)
        making = asyncio.create_task(_make_tree_in(db, scope, None if by_default else project_id))
        await asyncio.sleep(0.3)  # the tree's transaction is under way, and waits for this one

    if by_default:  # the scope's default project was deleted: a new one is made
        made_in = await making
        assert made_in != project_id and await _counts(db, made_in) == (1, 1)
    else:
        with pytest.raises(NotFound):
            await making
    assert await _counts(db, project_id) == (0, 0)
