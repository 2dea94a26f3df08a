"""Projects: named working directories that sessions belong to."""

from __future__ import annotations

import uuid
from pathlib import Path

from persistence.db import Connection
from persistence.errors import NotFound
from persistence.records import Row, Scope, new_id
from persistence.scopes import ensure_scope

_COLUMNS = "project_id, name, workdir, created_at"
DEFAULT_PROJECT_NAME = "default"


async def create_project(conn: Connection, scope: Scope, name: str, workdir_root: Path) -> Row:
    await ensure_scope(conn, scope)
    project_id = new_id()
    workdir = Path(workdir_root) / str(project_id)
    cur = await conn.execute(
        f"""INSERT INTO projects (project_id, user_id, app_id, name, workdir)
            VALUES (%s, %s, %s, %s, %s) RETURNING {_COLUMNS}""",
        (project_id, scope.user_id, scope.app_id, name, str(workdir)),
    )
    row = await cur.fetchone()
    assert row is not None
    return row


async def get_project(conn: Connection, scope: Scope, project_id: uuid.UUID) -> Row:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM projects WHERE project_id = %s AND user_id = %s AND app_id = %s",
        (project_id, scope.user_id, scope.app_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no project {project_id}")
    return row


async def list_projects(conn: Connection, scope: Scope) -> list[Row]:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM projects WHERE user_id = %s AND app_id = %s ORDER BY created_at",
        (scope.user_id, scope.app_id),
    )
    return await cur.fetchall()


async def default_project(conn: Connection, scope: Scope, workdir_root: Path) -> Row:
    """The scope's first project, created on first use."""
    projects = await list_projects(conn, scope)
    if projects:
        return projects[0]
    return await create_project(conn, scope, DEFAULT_PROJECT_NAME, workdir_root)
