"""The database itself refuses rows that break a tree's shape, a scope, or the Turn/Run rules."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import errors as pg_errors

from persistence.db import Database
from persistence.migrations import ensure_schema, latest_version
from persistence.records import RunRef, Scope
from tests.persistence.helpers import Tree, count_rows, fetch_one, make_tree, start_run, submit

_INSERT_SESSION = """
INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, parent_id, name, path, depth,
                      agent_config)
VALUES (%(session_id)s, %(tree_id)s, %(user_id)s, %(app_id)s, %(project_id)s, %(parent_id)s, %(name)s,
        %(path)s, %(depth)s, '{}')
"""


@dataclasses.dataclass
class World:
    scope: Scope
    a: Tree
    b: Tree
    run: RunRef  # an executing Run of a's root


@pytest.fixture
async def world(db: Database, scope: Scope) -> World:
    a = await make_tree(db, scope)
    b = await make_tree(db, scope, project_id=a.project_id)
    _, run = await start_run(db, scope, a.tree_id, a.root_id)
    return World(scope, a, b, run)


def _session(world: World, **overrides: Any) -> dict[str, Any]:
    """A valid child of tree a's root, changed by ``overrides``."""
    values = {"session_id": uuid.uuid4(), "tree_id": world.a.tree_id, "user_id": world.scope.user_id,
              "app_id": world.scope.app_id, "project_id": world.a.project_id, "parent_id": world.a.root_id,
              "name": "aaa", "path": "/root/aaa", "depth": 1}
    return {**values, **overrides}


async def _refused(db: Database, query: LiteralString, params: dict[str, Any]) -> psycopg.IntegrityError:
    before = await count_rows(db)
    with pytest.raises(psycopg.IntegrityError) as caught:
        async with db.tx() as conn:
            await conn.execute(query, params)
    assert await count_rows(db) == before
    return caught.value


async def test_schema_version_and_applied_once(db: Database, database_url: str) -> None:
    row = await fetch_one(db, "SELECT max(version) AS v FROM schema_version")
    assert row["v"] == latest_version()
    assert ensure_schema(database_url) is False  # already there: not applied twice


async def test_a_valid_child_row_is_accepted(db: Database, world: World) -> None:
    values = _session(world)
    async with db.tx() as conn:
        await conn.execute(_INSERT_SESSION, values)
    row = await fetch_one(db, "SELECT path, parent_id FROM sessions WHERE session_id = %s", (values["session_id"],))
    assert row == {"path": "/root/aaa", "parent_id": world.a.root_id}


async def test_root_with_a_parent_is_refused(db: Database, world: World) -> None:
    new_id = uuid.uuid4()
    error = await _refused(db, _INSERT_SESSION, _session(
        world, session_id=new_id, tree_id=new_id, name="root", path="/root", depth=0))
    assert isinstance(error, pg_errors.CheckViolation)
    assert error.diag.constraint_name == "sessions_tree_shape"
    assert "sessions_tree_shape" in str(error)


async def test_child_with_the_root_path_is_refused(db: Database, world: World) -> None:
    error = await _refused(db, _INSERT_SESSION, _session(world, path="/root"))
    assert isinstance(error, pg_errors.CheckViolation)
    assert error.diag.constraint_name == "sessions_tree_shape"


async def test_child_at_depth_zero_is_refused(db: Database, world: World) -> None:
    error = await _refused(db, _INSERT_SESSION, _session(world, depth=0))
    assert error.diag.constraint_name == "sessions_tree_shape"


async def test_child_whose_parent_is_in_another_tree_is_refused(db: Database, world: World) -> None:
    error = await _refused(db, _INSERT_SESSION, _session(world, parent_id=world.b.root_id))
    assert isinstance(error, pg_errors.ForeignKeyViolation)
    assert error.diag.constraint_name == "sessions_parent_same_tree_fk"
    assert "sessions_parent_same_tree_fk" in str(error)


async def test_session_of_another_user_than_its_tree_is_refused(db: Database, world: World) -> None:
    error = await _refused(db, _INSERT_SESSION, _session(world, user_id="someone-else"))
    assert isinstance(error, pg_errors.ForeignKeyViolation)
    assert error.diag.constraint_name == "sessions_tree_scope_fk"
    assert "sessions_tree_scope_fk" in str(error)


async def test_session_of_another_app_or_project_than_its_tree_is_refused(db: Database, world: World) -> None:
    error = await _refused(db, _INSERT_SESSION, _session(world, app_id="other-app"))
    assert error.diag.constraint_name == "sessions_tree_scope_fk"
    other = await make_tree(db, world.scope)  # another project of the same scope
    error = await _refused(db, _INSERT_SESSION, _session(world, project_id=other.project_id))
    assert error.diag.constraint_name == "sessions_tree_scope_fk"


@pytest.mark.parametrize("name", ["", "a/b", "../b", "a" * 65, "a b", "a\\b"])
async def test_session_name_must_be_a_local_name(db: Database, world: World, name: str) -> None:
    error = await _refused(db, _INSERT_SESSION, _session(world, name=name, path=f"/root/{name}"))
    assert error.diag.constraint_name == "sessions_name_check"


async def test_sibling_names_and_paths_are_unique(db: Database, world: World) -> None:
    async with db.tx() as conn:
        await conn.execute(_INSERT_SESSION, _session(world))
    error = await _refused(db, _INSERT_SESSION, _session(world, path="/root/other"))
    assert error.diag.constraint_name == "sessions_unique_sibling_name"
    error = await _refused(db, _INSERT_SESSION, _session(world, name="other"))
    assert error.diag.constraint_name == "sessions_unique_path"


async def test_input_of_another_scope_than_its_session_is_refused(db: Database, world: World) -> None:
    error = await _refused(
        db,
        """INSERT INTO inputs (input_id, session_id, user_id, app_id, text, origin)
           VALUES (%(id)s, %(session_id)s, 'someone-else', %(app_id)s, 'x', '{}')""",
        {"id": uuid.uuid4(), "session_id": world.a.root_id, "app_id": world.scope.app_id},
    )
    assert isinstance(error, pg_errors.ForeignKeyViolation)


async def test_second_open_turn_of_a_session_is_refused(db: Database, world: World) -> None:
    queued = await submit(db, world.scope, world.a.root_id, "second")  # waits behind the running turn
    assert queued["status"] == "queued"
    error = await _refused(
        db,
        "INSERT INTO turns (turn_id, session_id, input_id, status) VALUES (%(t)s, %(s)s, %(i)s, 'running')",
        {"t": uuid.uuid4(), "s": world.a.root_id, "i": queued["input_id"]},
    )
    assert isinstance(error, pg_errors.UniqueViolation)
    assert error.diag.constraint_name == "turns_one_open_per_session"
    assert "turns_one_open_per_session" in str(error)


async def test_waiting_for_only_while_waiting(db: Database, world: World) -> None:
    error = await _refused(db, "UPDATE turns SET status = 'waiting' WHERE turn_id = %(t)s",
                           {"t": world.run.turn_id})
    assert error.diag.constraint_name == "turns_waiting_for_only_when_waiting"


async def test_resume_of_a_run_of_another_turn_is_refused(db: Database, world: World) -> None:
    _, other = await start_run(db, world.scope, world.b.tree_id, world.b.root_id)
    error = await _refused(
        db,
        """INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, resumes_run_id)
           VALUES (%(r)s, %(t)s, %(s)s, %(tree)s, 'resume', %(resumes)s)""",
        {"r": uuid.uuid4(), "t": world.run.turn_id, "s": world.run.session_id, "tree": world.run.tree_id,
         "resumes": other.run_id},
    )
    assert isinstance(error, pg_errors.ForeignKeyViolation)
    assert error.diag.constraint_name == "runs_resume_same_turn_fk"
    assert "runs_resume_same_turn_fk" in str(error)


async def test_a_run_is_resumed_at_most_once(db: Database, world: World) -> None:
    resume = """INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, resumes_run_id)
                VALUES (%(r)s, %(t)s, %(s)s, %(tree)s, 'resume', %(resumes)s)"""
    params = {"t": world.run.turn_id, "s": world.run.session_id, "tree": world.run.tree_id,
              "resumes": world.run.run_id}
    async with db.tx() as conn:
        await conn.execute(resume, {**params, "r": uuid.uuid4()})
    error = await _refused(db, resume, {**params, "r": uuid.uuid4()})
    assert isinstance(error, pg_errors.UniqueViolation)
    assert error.diag.constraint_name == "runs_resumes_run_id_key"


async def test_resume_kind_and_resumed_run_go_together(db: Database, world: World) -> None:
    error = await _refused(
        db,
        """INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind)
           VALUES (%(r)s, %(t)s, %(s)s, %(tree)s, 'resume')""",
        {"r": uuid.uuid4(), "t": world.run.turn_id, "s": world.run.session_id, "tree": world.run.tree_id},
    )
    assert error.diag.constraint_name == "runs_resume_shape"


async def test_run_in_another_tree_than_its_session_is_refused(db: Database, world: World) -> None:
    error = await _refused(
        db,
        """INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind)
           VALUES (%(r)s, %(t)s, %(s)s, %(tree)s, 'start')""",
        {"r": uuid.uuid4(), "t": world.run.turn_id, "s": world.run.session_id, "tree": world.b.tree_id},
    )
    assert error.diag.constraint_name == "runs_session_tree_fk"


async def test_result_run_must_belong_to_its_turn(db: Database, world: World) -> None:
    _, other = await start_run(db, world.scope, world.b.tree_id, world.b.root_id)
    error = await _refused(db, "UPDATE turns SET result_run_id = %(r)s WHERE turn_id = %(t)s",
                           {"r": other.run_id, "t": world.run.turn_id})
    assert error.diag.constraint_name == "turns_result_run_fk"
