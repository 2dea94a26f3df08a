"""Projects: named working directories that sessions belong to."""

from __future__ import annotations

import uuid
from pathlib import Path

from persistence import quotas
from persistence.db import Connection
from persistence.errors import Conflict, NotFound
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


async def get_project(conn: Connection, scope: Scope, project_id: uuid.UUID, *, for_new_tree: bool = False,
                      for_delete: bool = False) -> Row:
    """``for_new_tree``: the project is kept until this transaction ends (a tree is about to be made
    in it); a delete that came first makes it a NotFound here, not a foreign key error later.
    ``for_delete``: locked against new trees (it waits for those being made)."""
    lock = "FOR KEY SHARE" if for_new_tree else "FOR UPDATE" if for_delete else ""
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM projects WHERE project_id = %s AND user_id = %s AND app_id = %s {lock}",
        (project_id, scope.user_id, scope.app_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no project {project_id}")
    return row


async def delete_project(conn: Connection, scope: Scope, project_id: uuid.UUID) -> Row:
    """Delete a project that holds no conversation; its row, as it was. One that holds any is a
    Conflict: a conversation's history is kept (archive hides it). A tree being made in it meanwhile
    (``get_project(..., for_new_tree=True)``) is waited for, and then counted."""
    await _check_empty(conn, await get_project(conn, scope, project_id))  # refused at once, no one kept waiting
    row = await get_project(conn, scope, project_id, for_delete=True)
    await _check_empty(conn, row)
    await conn.execute("DELETE FROM projects WHERE project_id = %s", (project_id,))
    return row


async def _check_empty(conn: Connection, project: Row) -> None:
    cur = await conn.execute("SELECT count(*) AS trees FROM trees WHERE project_id = %s", (project["project_id"],))
    held = await cur.fetchone()
    assert held is not None
    if held["trees"]:
        raise Conflict(f"project {project['project_id']} holds {held['trees']} conversation(s), whose history is "
                       "kept: only a project without conversations can be deleted (archive hides a conversation)")


async def list_projects(conn: Connection, scope: Scope) -> list[Row]:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM projects WHERE user_id = %s AND app_id = %s ORDER BY created_at",
        (scope.user_id, scope.app_id),
    )
    return await cur.fetchall()


async def default_project(conn: Connection, scope: Scope, workdir_root: Path) -> Row:
    """The scope's oldest project (the default one deleted, the next oldest), created on first use;
    kept until this transaction ends, for the tree about to be made in it (see ``get_project``)."""
    first = await _oldest_project(conn, scope)
    if first is None:
        # Two first uses at once make one: the second looks again once the first has committed.
        await quotas.hold(conn, scope, "projects")
        first = await _oldest_project(conn, scope)
    return first if first is not None else await create_project(conn, scope, DEFAULT_PROJECT_NAME, workdir_root)


async def _oldest_project(conn: Connection, scope: Scope) -> Row | None:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM projects WHERE user_id = %s AND app_id = %s ORDER BY created_at LIMIT 1 FOR KEY SHARE",
        (scope.user_id, scope.app_id),
    )
    return await cur.fetchone()
