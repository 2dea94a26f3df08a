"""Scoped reads the HTTP API needs beyond what the actors use."""

from __future__ import annotations

import uuid

from persistence.db import Connection
from persistence.errors import NotFound
from persistence.messages import history
from persistence.records import Row, Scope
from persistence.sessions import get_session_row

_TREE = """
SELECT tree_id, project_id, slot_limit, stopped, archived, created_at FROM trees
WHERE tree_id = %s AND user_id = %s AND app_id = %s
"""


async def require_tree(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> Row:
    """The tree, or NotFound when it is absent from this scope."""
    cur = await conn.execute(_TREE, (tree_id, scope.user_id, scope.app_id))
    tree = await cur.fetchone()
    if tree is None:
        raise NotFound(f"no tree {tree_id}")
    return tree


async def session_messages(conn: Connection, scope: Scope, session_id: uuid.UUID, *, after_id: int = 0,
                           limit: int = 1000) -> list[Row]:
    """A session's history, oldest first, after checking the session is in the scope."""
    await get_session_row(conn, scope, session_id)
    return await history(conn, session_id, after_id=after_id, limit=limit)
