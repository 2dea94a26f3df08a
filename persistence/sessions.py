"""Sessions and their trees: creation (root and child), lookup, target resolution, views.

The parent of a child is always the session whose Run created it, and its path is
derived from the parent's path and the local name; callers never name a parent or path.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from persistence.db import MAX_BIGINT, Connection, advisory_lock, query
from persistence.errors import Conflict, InvalidArgument, LimitExceeded, NotFound, shown
from persistence.events import append_event
from persistence.records import Row, RunRef, Scope, new_id
from persistence.scopes import ensure_scope
from persistence.statuses import OPEN_TURN_STATUSES, Activity, RunStatus, TurnStatus
from persistence.usage import budget_columns

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_PATH = 1024
ROOT_PATH = "/root"

SESSION_COLUMNS = """
s.session_id, s.tree_id, s.parent_id, s.name, s.path, s.depth, s.title, s.agent_id, s.agent_config,
s.project_id, s.created_by_run_id, s.origin, s.queue_paused, s.archived, s.created_at, s.updated_at
"""
# What a Run reads of its Turn's input beside its session's row (``pop_turn_input``): the input's id
# and the tools it grants the Turn (``cooperation._origin`` writes them when a Turn gives the input).
TURN_INPUT_COLUMNS = """
t.input_id AS turn_input_id,
(SELECT i.origin->'tools' FROM inputs i WHERE i.input_id = t.input_id) AS turn_granted_tools
"""
# Member state without outputs: the open (or last) Turn, its latest Run, pending inputs.
STATE_JOINS = """
LEFT JOIN LATERAL (
    SELECT turn_id, status, waiting_for FROM turns
    WHERE session_id = s.session_id ORDER BY created_at DESC LIMIT 1) t ON true
LEFT JOIN LATERAL (
    SELECT status FROM runs WHERE turn_id = t.turn_id ORDER BY queued_at DESC LIMIT 1) lr ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n FROM inputs WHERE session_id = s.session_id AND status = 'pending') p ON true
"""
_STATE_COLUMNS = "t.turn_id, t.status AS turn_status, t.waiting_for, lr.status AS run_status, " \
    "p.n AS pending_inputs"


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(
            f"invalid session name {shown(name)}: use 1-64 letters, digits, '_' or '-' (a local name, "
            "never a path; the parent is always the creating session)"
        )
    return name


def activity(state: Row) -> Activity:
    """The derived activity of a session, for lists and the UI."""
    status = state.get("turn_status")
    if status == TurnStatus.CANCELLING:
        return Activity.CANCELLING
    if status == TurnStatus.WAITING:
        return Activity(f"waiting_{state['waiting_for']}")
    if status == TurnStatus.RUNNING:
        return Activity.RUNNING if state.get("run_status") == RunStatus.RUNNING else Activity.QUEUED
    if state.get("pending_inputs") and not state.get("queue_paused"):
        return Activity.QUEUED
    return Activity.IDLE


def _view(row: Row) -> Row:
    view = dict(row)
    view["activity"] = activity(row)
    open_turn = row.get("turn_status") in OPEN_TURN_STATUSES
    view["current_turn_id"] = row.get("turn_id") if open_turn else None
    view["status"] = "archived" if row["archived"] else "active"
    return view


async def _insert_session(conn: Connection, values: dict[str, Any]) -> bool:
    """Insert a session; False (nothing written) if its parent has a child of that name already."""
    cur = await conn.execute(
        """INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, parent_id, name, path,
                                 depth, title, agent_id, agent_config, created_by_run_id, origin)
           VALUES (%(session_id)s, %(tree_id)s, %(user_id)s, %(app_id)s, %(project_id)s, %(parent_id)s,
                   %(name)s, %(path)s, %(depth)s, %(title)s, %(agent_id)s, %(agent_config)s,
                   %(created_by_run_id)s, %(origin)s)
           ON CONFLICT ON CONSTRAINT sessions_unique_sibling_name DO NOTHING""",
        {**values, "agent_config": Jsonb(values["agent_config"]), "origin": Jsonb(values["origin"])},
    )
    return cur.rowcount == 1


async def create_root(
    conn: Connection,
    scope: Scope,
    *,
    project_id: uuid.UUID,
    agent_id: str | None,
    agent_config: dict[str, Any],
    slot_limit: int,
    title: str = "",
    origin: dict[str, Any] | None = None,
    created_by_run_id: uuid.UUID | None = None,
    spawned_by: Spawn | None = None,
    budget: dict[str, Any] | None = None,
) -> uuid.UUID:
    """A new tree and its root session (no input yet). ``spawned_by``: the tree whose Run made it
    with create_session(mode="root"); the new tree joins that tree's lineage, within its limit, and
    stays under that tree's budget. ``budget``: the tree's own (see persistence/usage.py)."""
    columns = budget_columns(budget)
    await ensure_scope(conn, scope)
    session_id = new_id()
    lineage_id = session_id
    if spawned_by is not None:
        lineage_id = await _claim_spawn(conn, spawned_by)
    await conn.execute(query("tree_insert"), {
        "tree_id": session_id, "user_id": scope.user_id, "app_id": scope.app_id, "project_id": project_id,
        "slot_limit": slot_limit, "lineage_id": lineage_id,
        "spawned_by": spawned_by.tree_id if spawned_by else None, **columns})
    await _insert_session(conn, {
        "session_id": session_id, "tree_id": session_id, "user_id": scope.user_id, "app_id": scope.app_id,
        "project_id": project_id, "parent_id": None, "name": "root", "path": ROOT_PATH, "depth": 0,
        "title": title, "agent_id": agent_id, "agent_config": agent_config,
        "created_by_run_id": created_by_run_id, "origin": origin or {"kind": "api"},
    })
    await append_event(conn, scope, "session_created", session_id=session_id, tree_id=session_id,
                       payload={"path": ROOT_PATH, "parent_id": None})
    return session_id


@dataclasses.dataclass(frozen=True)
class Spawn:
    """A root-mode create: the tree it comes from, and how many trees its lineage may spawn."""

    tree_id: uuid.UUID
    max_spawned_trees: int


async def _claim_spawn(conn: Connection, spawn: Spawn) -> uuid.UUID:
    """The lineage a spawned tree joins, if it has room; LimitExceeded (nothing written) if not.

    The count and the insert that follows are serialised per lineage (a transaction-scoped
    advisory lock), so concurrent spawns cannot overshoot the limit."""
    cur = await conn.execute(query("tree_lineage"), {"tree_id": spawn.tree_id})
    tree = await cur.fetchone()
    if tree is None:
        raise NotFound(f"no tree {spawn.tree_id}")
    lineage_id = tree["lineage_id"]
    await advisory_lock(conn, "canopy.lineage-spawns", lineage_id)
    cur = await conn.execute(query("spawned_trees_count"), {"lineage_id": lineage_id})
    row = await cur.fetchone()
    assert row is not None
    if row["spawned"] >= spawn.max_spawned_trees:
        raise LimitExceeded(
            f"this tree and the trees spawned from it have made {row['spawned']} root-mode trees; the limit is "
            f"{spawn.max_spawned_trees} (setting CANOPY_MAX_SPAWNED_TREES): create a child session instead")
    return lineage_id


async def create_child(
    conn: Connection,
    parent: Row,
    *,
    name: str,
    agent_id: str | None,
    agent_config: dict[str, Any],
    max_depth: int,
    max_members: int,
    created_by_run_id: uuid.UUID,
    title: str = "",
) -> Row:
    """A child of ``parent`` (the creating session, already locked by the caller), if the tree has
    room for one more member (``max_members``; LimitExceeded, nothing written, if not)."""
    check_name(name)
    depth = parent["depth"] + 1
    if depth > max_depth:
        raise InvalidArgument(
            f"cannot create {name!r} under {parent['path']}: depth {depth} exceeds the maximum depth "
            f"{max_depth}" + (" (children are disabled)" if max_depth == 0 else "")
        )
    path = f"{parent['path']}/{name}"
    if len(path) > MAX_PATH:
        raise InvalidArgument(f"path {path[:80]}... is longer than {MAX_PATH} characters")
    # The count and the insert below are serialised per tree, until this transaction ends.
    await advisory_lock(conn, "canopy.tree-members", parent["tree_id"])
    cur = await conn.execute(query("tree_member_count"), {"tree_id": parent["tree_id"]})
    members = await cur.fetchone()
    assert members is not None
    if members["n"] >= max_members:
        raise LimitExceeded(
            f"cannot create {name!r}: this tree has {members['n']} sessions, the limit "
            f"(setting CANOPY_MAX_SESSIONS_PER_TREE) is {max_members}")
    session_id = new_id()
    scope = Scope(parent["user_id"], parent["app_id"])
    inserted = await _insert_session(conn, {
        "session_id": session_id, "tree_id": parent["tree_id"], "user_id": scope.user_id,
        "app_id": scope.app_id, "project_id": parent["project_id"], "parent_id": parent["session_id"],
        "name": name, "path": path, "depth": depth, "title": title or name, "agent_id": agent_id,
        "agent_config": agent_config, "created_by_run_id": created_by_run_id,
        "origin": {"kind": "session", "session_id": str(parent["session_id"]), "path": parent["path"]},
    })
    if not inserted:
        raise Conflict(f"{parent['path']} already has a session named {name!r}")
    await append_event(conn, scope, "session_created", session_id=session_id, tree_id=parent["tree_id"],
                       payload={"path": path, "parent_id": str(parent["session_id"])})
    return {"session_id": session_id, "name": name, "path": path, "parent_session_id": parent["session_id"],
            "tree_id": parent["tree_id"], "depth": depth}


async def get_session_row(conn: Connection, scope: Scope, session_id: uuid.UUID, *, lock: bool = False) -> Row:
    """The session's row; with ``lock`` it is locked like ``turns.lock_session`` locks it."""
    cur = await conn.execute(
        f"""SELECT {SESSION_COLUMNS}, s.user_id, s.app_id FROM sessions s
            WHERE s.session_id = %s AND s.user_id = %s AND s.app_id = %s
            {"FOR NO KEY UPDATE" if lock else ""}""",
        (session_id, scope.user_id, scope.app_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no session {session_id}")
    return row


@dataclasses.dataclass(frozen=True)
class TurnInput:
    """A Run's Turn's input: its id, and the tools it grants the Turn (None: it came from no Turn).
    Read from the input, never from the history: a compaction summary is a user row of the Turn
    that asked for it, ahead of the Turn's input in the history of every later Run of that Turn."""

    input_id: uuid.UUID
    granted: list[str] | None


def pop_turn_input(row: Row) -> TurnInput:
    """The Turn's input read with ``TURN_INPUT_COLUMNS``, taken out of ``row``."""
    tools = row.pop("turn_granted_tools")
    return TurnInput(row.pop("turn_input_id"), [str(tool) for tool in tools] if isinstance(tools, list) else None)


async def session_and_turn_input(conn: Connection, run: RunRef) -> tuple[Row, TurnInput]:
    """What a Run reads first, in one statement: its session's row and its Turn's input."""
    cur = await conn.execute(
        f"""SELECT {SESSION_COLUMNS}, s.user_id, s.app_id, {TURN_INPUT_COLUMNS}
            FROM sessions s JOIN turns t ON t.session_id = s.session_id
            WHERE s.session_id = %s AND s.user_id = %s AND s.app_id = %s AND t.turn_id = %s""",
        (run.session_id, run.scope.user_id, run.scope.app_id, run.turn_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no session {run.session_id} with turn {run.turn_id}")
    return row, pop_turn_input(row)


async def get_session(conn: Connection, scope: Scope, session_id: uuid.UUID) -> Row:
    """A session with its activity, current Turn and queue state."""
    cur = await conn.execute(
        f"""SELECT {SESSION_COLUMNS}, {_STATE_COLUMNS} FROM sessions s {STATE_JOINS}
            WHERE s.session_id = %s AND s.user_id = %s AND s.app_id = %s""",
        (session_id, scope.user_id, scope.app_id),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no session {session_id}")
    return _view(row)


async def resolve_target(conn: Connection, scope: Scope, tree_id: uuid.UUID, target: Any) -> Row:
    """A session_id anywhere in the scope, or a path inside the caller's own tree."""
    if not isinstance(target, str) or not target:
        raise InvalidArgument("target must be a session_id or a path like /root/name")
    try:
        session_id = uuid.UUID(target)
    except ValueError:
        if not (target == ROOT_PATH or target.startswith(ROOT_PATH + "/")):
            raise InvalidArgument(
                f"target {shown(target)} is neither a session_id nor a path starting with /root"
            ) from None
        cur = await conn.execute(
            f"""SELECT {SESSION_COLUMNS}, s.user_id, s.app_id FROM sessions s
                WHERE s.tree_id = %s AND s.path = %s AND s.user_id = %s AND s.app_id = %s""",
            (tree_id, target, scope.user_id, scope.app_id),
        )
        row = await cur.fetchone()
        if row is None:
            raise NotFound(f"no session at {shown(target)} in this tree") from None
        return row
    return await get_session_row(conn, scope, session_id)


# A scope's roots, newest first: each form a statement of its own, so that even the generic plan a
# prepared statement settles on reads only the rows it lists: live roots (the sidebar's list, every
# few seconds) from their own partial indexes; with the archived ones (asked for), that range and the
# archived roots' merged, a page reading at most two. A page goes on after a root, or from the start
# (a key past every root's: 'infinity' and the largest uuid).
_ROOTS_OF = {False: "s.user_id = %(user_id)s AND s.app_id = %(app_id)s",
             True: "s.project_id = %(project_id)s AND s.user_id = %(user_id)s AND s.app_id = %(app_id)s"}


def _range_of_roots(of_project: bool, archived: bool) -> str:
    return f"""(SELECT s.* FROM sessions s
        WHERE {_ROOTS_OF[of_project]} AND s.parent_id IS NULL AND {"" if archived else "NOT "}s.archived
          AND (s.created_at, s.session_id) < (%(before_at)s::timestamptz, %(before)s::uuid)
        ORDER BY s.created_at DESC, s.session_id DESC LIMIT %(end)s)"""


_ROOTS = {
    (of_project, with_archived): f"""SELECT {SESSION_COLUMNS}, {_STATE_COLUMNS}
        FROM ({_range_of_roots(of_project, False)}
              {"UNION ALL " + _range_of_roots(of_project, True) if with_archived else ""}) s {STATE_JOINS}
        ORDER BY s.created_at DESC, s.session_id DESC LIMIT %(limit)s OFFSET %(offset)s"""
    for of_project in (False, True) for with_archived in (False, True)
}
_AFTER_EVERY_ROOT = ("infinity", uuid.UUID(int=(1 << 128) - 1))


async def list_roots(conn: Connection, scope: Scope, *, project_id: uuid.UUID | None, offset: int,
                     limit: int, include_archived: bool = False, before: uuid.UUID | None = None) -> list[Row]:
    """Root sessions, newest first. ``before`` (a root of the scope: NotFound otherwise) continues a
    list after that root, wherever roots made or archived since have moved it; ``offset`` counts
    from the start (or from ``before``)."""
    before_at, before = _AFTER_EVERY_ROOT if before is None else (
        (await get_session_row(conn, scope, before))["created_at"], before)
    cur = await conn.execute(
        _ROOTS[project_id is not None, include_archived],
        {"user_id": scope.user_id, "app_id": scope.app_id, "project_id": project_id, "limit": limit,
         "offset": offset, "end": min(offset + limit, MAX_BIGINT), "before": before, "before_at": before_at},
    )
    return [_view(row) for row in await cur.fetchall()]


async def list_project_sessions(conn: Connection, scope: Scope, project_id: uuid.UUID, *, offset: int = 0,
                                limit: int | None = None, include_archived: bool = False) -> list[Row]:
    """Sessions of a project by tree and path, archived trees' only with ``include_archived``."""
    cur = await conn.execute(
        f"""SELECT {SESSION_COLUMNS}, {_STATE_COLUMNS} FROM sessions s {STATE_JOINS}
            WHERE s.user_id = %(user_id)s AND s.app_id = %(app_id)s AND s.project_id = %(project_id)s
              AND (%(archived)s OR NOT s.archived)
            ORDER BY s.tree_id, s.path LIMIT %(limit)s OFFSET %(offset)s""",
        {"user_id": scope.user_id, "app_id": scope.app_id, "project_id": project_id, "limit": limit,
         "offset": offset, "archived": include_archived},
    )
    return [_view(row) for row in await cur.fetchall()]


# The scope's sessions newest first, from its live ones' index and (asked for) its archived ones':
# two partial indexes, as a lookup of one session by its key and scope can use neither (see
# migration 0030). Each part reads no more than the page's end.
_SCOPE_PAGE = f"""
WITH page AS (
    (SELECT session_id, created_at FROM sessions
     WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND NOT archived
     ORDER BY created_at DESC, session_id LIMIT %(end)s)
    UNION ALL
    (SELECT session_id, created_at FROM sessions
     WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND archived AND %(archived)s
     ORDER BY created_at DESC, session_id LIMIT %(end)s)
    ORDER BY created_at DESC, session_id LIMIT %(limit)s OFFSET %(offset)s
)
SELECT {SESSION_COLUMNS}, {_STATE_COLUMNS} FROM page JOIN sessions s ON s.session_id = page.session_id {STATE_JOINS}
ORDER BY s.created_at DESC, s.session_id
"""


async def list_scope_sessions(conn: Connection, scope: Scope, *, offset: int, limit: int,
                              include_archived: bool = False) -> list[Row]:
    """The scope's sessions (every tree's) newest first, archived trees' only with ``include_archived``."""
    cur = await conn.execute(_SCOPE_PAGE, {
        "user_id": scope.user_id, "app_id": scope.app_id, "limit": limit, "offset": offset,
        "end": min(offset + limit, MAX_BIGINT), "archived": include_archived})
    return [_view(row) for row in await cur.fetchall()]


async def tree_members(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> list[Row]:
    """Every member of a tree with its state, in one statement, no outputs."""
    cur = await conn.execute(
        f"""SELECT {SESSION_COLUMNS}, {_STATE_COLUMNS} FROM sessions s {STATE_JOINS}
            WHERE s.tree_id = %s AND s.user_id = %s AND s.app_id = %s
            ORDER BY s.depth, s.path""",
        (tree_id, scope.user_id, scope.app_id),
    )
    return [_view(row) for row in await cur.fetchall()]


async def set_title(conn: Connection, scope: Scope, session_id: uuid.UUID, title: str) -> Row:
    cur = await conn.execute(
        "UPDATE sessions SET title = %s, updated_at = now() WHERE session_id = %s AND user_id = %s "
        "AND app_id = %s RETURNING session_id",
        (title, session_id, scope.user_id, scope.app_id),
    )
    if await cur.fetchone() is None:
        raise NotFound(f"no session {session_id}")
    return await get_session(conn, scope, session_id)


def workdir_of(project: Row) -> Path:
    return Path(project["workdir"])


async def request_compaction(conn: Connection, scope: Scope, session_id: uuid.UUID) -> Row:
    """Ask for the session's history to be compacted at its next model call (NotFound elsewhere;
    Conflict for an archived session, which makes no more)."""
    cur = await conn.execute(query("compact_request"), {"session_id": session_id, "user_id": scope.user_id,
                                                        "app_id": scope.app_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no session {session_id}")
    if row["archived"]:
        raise Conflict(f"session {session_id} is archived: it makes no more model calls, so nothing is compacted")
    return row
