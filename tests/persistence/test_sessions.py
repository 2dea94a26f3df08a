"""Creating sessions: local names only, parent = the creating Run's session, depth limit, targets."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from persistence import cooperation, sessions, trees
from persistence.databases import create_database, drop_database
from persistence.db import Database
from persistence.errors import Conflict, InvalidArgument, NotFound
from persistence.records import Scope
from tests.persistence.helpers import (
    AGENT_CONFIG,
    DISPATCHER,
    PLANNED_AT_SCALE,
    ExplainingConnection,
    GenericPlanExplainingConnection,
    Tree,
    child_run,
    count_rows,
    create_child,
    fetch_all,
    fetch_one,
    indexes_read,
    latest_run_id,
    limits,
    make_tree,
    rows_read,
    session_row,
    start_root_run,
    submit,
)

REJECTED_NAMES = ["/root/aaa/bbb", "aaa/bbb", "/root/name", "../bbb", "aaa\\bbb", "aaa%2Fbbb", "", "a" * 65]
ACCEPTED_NAMES = ["aaa", "worker-1", "review_2", "b" * 64]


@pytest.mark.parametrize("name", REJECTED_NAMES)
async def test_path_like_and_bad_names_are_rejected_with_nothing_stored(db: Database, scope: Scope,
                                                                        name: str) -> None:
    _, run = await start_root_run(db, scope)
    before = await count_rows(db)
    with pytest.raises(InvalidArgument, match="invalid session name"):
        await create_child(db, run, name)
    assert await count_rows(db) == before  # no session, input, turn, run, event or receipt


@pytest.mark.parametrize("name", ACCEPTED_NAMES)
async def test_local_names_are_accepted(db: Database, scope: Scope, name: str) -> None:
    tree, run = await start_root_run(db, scope)
    before = await count_rows(db)
    child = await create_child(db, run, name, description=f"task of {name}")
    row = await session_row(db, child["session_id"])
    assert (row["name"], row["path"], row["depth"]) == (name, f"/root/{name}", 1)
    assert row["parent_id"] == tree.root_id and row["tree_id"] == tree.tree_id
    after = await count_rows(db)
    assert after["sessions"] == before["sessions"] + 1
    assert after["inputs"] == before["inputs"] + 1
    first_input = await fetch_one(db, "SELECT text, status FROM inputs WHERE input_id = %s",
                                  (uuid.UUID(child["input_id"]),))
    assert first_input == {"text": f"task of {name}", "status": "consumed"}


async def test_paths_follow_the_creating_runs(db: Database, scope: Scope) -> None:
    tree, root_run = await start_root_run(db, scope)
    aaa, aaa_run = await child_run(db, root_run, "aaa")
    bbb = await create_child(db, aaa_run, "bbb")

    assert aaa["path"] == "/root/aaa" and bbb["path"] == "/root/aaa/bbb"
    assert aaa["parent_session_id"] == str(tree.root_id)
    assert bbb["parent_session_id"] == aaa["session_id"]
    rows = await fetch_all(
        db, "SELECT path, parent_id, depth, tree_id, created_by_run_id FROM sessions WHERE tree_id = %s "
            "ORDER BY depth", (tree.tree_id,))
    assert rows == [
        {"path": "/root", "parent_id": None, "depth": 0, "tree_id": tree.tree_id, "created_by_run_id": None},
        {"path": "/root/aaa", "parent_id": tree.root_id, "depth": 1, "tree_id": tree.tree_id,
         "created_by_run_id": root_run.run_id},
        {"path": "/root/aaa/bbb", "parent_id": uuid.UUID(aaa["session_id"]), "depth": 2, "tree_id": tree.tree_id,
         "created_by_run_id": aaa_run.run_id},
    ]
    # The creating Run belongs to the parent session.
    creators = await fetch_all(
        db, """SELECT s.path, r.session_id = s.parent_id AS by_parent FROM sessions s
               JOIN runs r ON r.run_id = s.created_by_run_id WHERE s.tree_id = %s ORDER BY s.depth""",
        (tree.tree_id,))
    assert creators == [{"path": "/root/aaa", "by_parent": True}, {"path": "/root/aaa/bbb", "by_parent": True}]


async def test_same_name_under_another_parent_is_another_session(db: Database, scope: Scope) -> None:
    _, root_run = await start_root_run(db, scope)
    _, aaa_run = await child_run(db, root_run, "aaa")
    top = await create_child(db, root_run, "bbb")
    nested = await create_child(db, aaa_run, "bbb")
    assert (top["path"], nested["path"]) == ("/root/bbb", "/root/aaa/bbb")


async def test_duplicate_sibling_name_is_a_conflict_with_nothing_stored(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    await create_child(db, run, "aaa")
    before = await count_rows(db)
    with pytest.raises(Conflict, match="already has a session named 'aaa'"):
        await create_child(db, run, "aaa")
    assert await count_rows(db) == before


async def test_depth_limit_two_rejects_a_great_grandchild(db: Database, scope: Scope) -> None:
    _, root_run = await start_root_run(db, scope)
    _, aaa_run = await child_run(db, root_run, "aaa")
    _, bbb_run = await child_run(db, aaa_run, "bbb")
    before = await count_rows(db)
    with pytest.raises(InvalidArgument, match="exceeds the maximum depth 2"):
        await create_child(db, bbb_run, "ccc")
    assert await count_rows(db) == before


async def test_max_depth_zero_rejects_any_child(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    before = await count_rows(db)
    with pytest.raises(InvalidArgument, match="children are disabled"):
        await create_child(db, run, "aaa", max_depth=0)
    assert await count_rows(db) == before


async def test_a_raised_max_depth_allows_deeper_trees(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    for name in ("a1", "a2", "a3"):
        child, run = await child_run(db, run, name, max_depth=3)
    assert child["path"] == "/root/a1/a2/a3"
    assert (await session_row(db, child["session_id"]))["depth"] == 3


async def test_root_mode_makes_an_independent_tree_that_records_its_origin(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        made = await cooperation.create_session(conn, run, "call-root", name="side", description="independent",
                                                mode="root", limits=limits(slot_limit=3), dispatcher=DISPATCHER)
    row = await session_row(db, made["session_id"])
    assert made["path"] == "/root" and made["parent_session_id"] is None
    assert row["parent_id"] is None and row["tree_id"] == row["session_id"] != tree.tree_id
    assert row["created_by_run_id"] == run.run_id and row["project_id"] == tree.project_id
    assert row["origin"]["run_id"] == str(run.run_id)
    made_tree = await fetch_one(db, "SELECT slot_limit, lineage_id, spawned_by_tree_id FROM trees WHERE tree_id = %s",
                                (row["tree_id"],))
    assert made_tree == {"slot_limit": 3, "lineage_id": tree.tree_id, "spawned_by_tree_id": tree.tree_id}


async def test_paths_resolve_only_inside_the_callers_tree(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    other, _other_run = await start_root_run(db, scope)
    async with db.tx() as conn:
        found = await sessions.resolve_target(conn, scope, tree.tree_id, "/root/aaa")
        by_id = await sessions.resolve_target(conn, scope, other.tree_id, aaa["session_id"])
        own_root = await sessions.resolve_target(conn, scope, other.tree_id, "/root")
    assert found["session_id"] == by_id["session_id"] == uuid.UUID(aaa["session_id"])
    assert own_root["session_id"] == other.root_id
    with pytest.raises(NotFound):
        async with db.tx() as conn:
            await sessions.resolve_target(conn, scope, other.tree_id, "/root/aaa")
    for bad in ("aaa", "../aaa", "", "/rootx"):
        with pytest.raises(InvalidArgument):
            async with db.tx() as conn:
                await sessions.resolve_target(conn, scope, tree.tree_id, bad)


async def test_title_is_editable_and_name_is_not(db: Database, scope: Scope) -> None:
    _, run = await start_root_run(db, scope)
    aaa = await create_child(db, run, "aaa")
    async with db.tx() as conn:
        view = await sessions.set_title(conn, scope, uuid.UUID(aaa["session_id"]), "A nicer title")
    assert (view["title"], view["name"], view["path"]) == ("A nicer title", "aaa", "/root/aaa")
    row = await session_row(db, aaa["session_id"])
    assert (row["title"], row["name"]) == ("A nicer title", "aaa")


async def test_session_view_reports_activity(db: Database, scope: Scope) -> None:
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        view = await sessions.get_session(conn, scope, tree.root_id)
    assert view["activity"] == "running" and view["current_turn_id"] == run.turn_id
    assert view["status"] == "active" and view["pending_inputs"] == 0


async def test_the_scopes_sessions_are_paged_newest_first_live_and_archived(db: Database, scope: Scope) -> None:
    made = [await make_tree(db, scope) for _ in range(5)]
    async with db.tx() as conn:
        for tree in made[1::2]:
            await trees.archive_root(conn, scope, tree.root_id)
    newest_first = [tree.root_id for tree in reversed(made)]

    async def page(offset: int, limit: int, include_archived: bool) -> list[uuid.UUID]:
        async with db.tx() as conn:
            rows = await sessions.list_scope_sessions(conn, scope, offset=offset, limit=limit,
                                                      include_archived=include_archived)
        return [row["session_id"] for row in rows]

    live = [root for root in newest_first if root not in {t.root_id for t in made[1::2]}]
    assert await page(0, 100, False) == live
    assert [root for offset in (0, 2, 4) for root in await page(offset, 2, True)] == newest_first
    assert await page(1, 2, False) == live[1:3] and await page(5, 2, True) == []


def test_a_session_is_looked_up_by_its_key_in_a_database_without_statistics(database_url: str) -> None:
    """Given a session's key and its scope, a planner without statistics (a new database, a burst of
    sessions before autovacuum's analyze) took the index of the scope's sessions, as selective by its
    guess, and read all of the scope's sessions for each lookup; a tree's members likewise."""
    url = create_database(database_url, "canopy_unanalyzed")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_SCOPE_OF_500)
            session_id, tree_id = conn.execute(
                "SELECT session_id, tree_id FROM sessions ORDER BY path DESC LIMIT 1").fetchone()  # type: ignore[misc]
            plans = {
                what: "\n".join(row[0] for row in conn.execute("EXPLAIN " + statement, arguments))
                for what, statement, arguments in (
                    ("one session", "SELECT * FROM sessions WHERE session_id = %s AND user_id = 'u' AND app_id = 'a'",
                     (session_id,)),
                    ("a tree's members", "SELECT * FROM sessions WHERE tree_id = %s AND user_id = 'u' AND app_id = 'a'",
                     (tree_id,)))}
        for what, plan in plans.items():
            assert "sessions_scope" not in plan, f"{what}:\n{plan}"
    finally:
        drop_database(url)


# One scope, one tree of 500 sessions, written as a burst: no ANALYZE has run.
_SCOPE_OF_500 = """
INSERT INTO scopes (user_id, app_id) VALUES ('u', 'a');
INSERT INTO projects (project_id, user_id, app_id, name, workdir)
VALUES ('00000000-0000-0000-0000-000000000001', 'u', 'a', 'p', '/tmp/p');
INSERT INTO trees (tree_id, user_id, app_id, project_id, slot_limit, lineage_id, spawn_chain)
VALUES ('00000000-0000-0000-0000-0000000000aa', 'u', 'a', '00000000-0000-0000-0000-000000000001', 4,
        '00000000-0000-0000-0000-0000000000aa', ARRAY['00000000-0000-0000-0000-0000000000aa'::uuid]);
INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, name, path, depth, agent_config)
VALUES ('00000000-0000-0000-0000-0000000000aa', '00000000-0000-0000-0000-0000000000aa', 'u', 'a',
        '00000000-0000-0000-0000-000000000001', 'root', '/root', 0, '{}');
INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, parent_id, name, path, depth, agent_config)
SELECT gen_random_uuid(), '00000000-0000-0000-0000-0000000000aa', 'u', 'a', '00000000-0000-0000-0000-000000000001',
       '00000000-0000-0000-0000-0000000000aa', 'm' || n, '/root/m' || n, 1, '{}'
FROM generate_series(1, 499) AS n;
"""


async def test_a_sessions_state_reads_one_run_of_its_turn_however_many_it_had(db: Database, scope: Scope) -> None:
    """Every session listed (the sidebar's roots, a tree's members) shows its latest Run's status: a
    Turn that parked and resumed 300 times (a root waiting on its children one by one) had all its
    Runs read and sorted for each of them."""
    tree = await make_tree(db, scope)
    receipt = await submit(db, scope, tree.root_id)
    first = await latest_run_id(db, receipt["turn_id"])
    async with db.tx() as conn:
        await conn.execute(
            """WITH RECURSIVE chain(n, run_id, resumes) AS (
                   SELECT 1, gen_random_uuid(), %(first)s::uuid
                   UNION ALL SELECT n + 1, gen_random_uuid(), run_id FROM chain WHERE n < 300)
               INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, resumes_run_id, status, queued_at)
               SELECT run_id, %(turn)s, %(session)s, %(session)s, 'resume', resumes, 'interrupted',
                      clock_timestamp() + make_interval(secs => n)
               FROM chain""",
            {"first": first, "turn": receipt["turn_id"], "session": tree.root_id})
        await conn.execute("ANALYZE runs")
        await conn.execute(PLANNED_AT_SCALE)
        explaining = ExplainingConnection(conn)
        await sessions.get_session(explaining, scope, tree.root_id)  # type: ignore[arg-type]
    assert rows_read(explaining.plans[-1], "runs") <= 1, explaining.plans[-1]


async def _tree_of(db: Database, scope: Scope, *, members: int) -> Tree:
    """A new tree of a root and ``members`` children named m000, m001, …"""
    tree, run = await start_root_run(db, scope)
    async with db.tx() as conn:
        root = await sessions.get_session_row(conn, scope, tree.root_id)
        for index in range(members):
            await sessions.create_child(conn, root, name=f"m{index:03d}", agent_id=None, agent_config=AGENT_CONFIG,
                                        max_depth=2, max_members=1000, created_by_run_id=run.run_id)
    return tree


async def test_the_live_roots_are_listed_without_reading_archived_roots_or_members(
        db: Database, scope: Scope) -> None:
    """The sidebar lists a scope's live roots every few seconds (of one project, or all, page after
    page): the archived roots newer than them and the members of a live tree older than them were
    each read and filtered out, in the plan a prepared statement settles on after its first runs (a
    generic one) as well. Asked for, the archived roots come in the same order, a page costing at
    most two (one of live roots, one of archived)."""
    big_tree = await _tree_of(db, scope, members=300)
    big, project = big_tree.root_id, big_tree.project_id
    # An archived tree with members among the live ones: the lists with the archived roots merge.
    early = await _tree_of(db, scope, members=30)
    live = [await make_tree(db, scope, project_id=project if n == 0 else None) for n in range(3)]
    archived = [await make_tree(db, scope, project_id=project) for _ in range(300)]
    newest_archived = [tree.root_id for tree in reversed(archived)]
    oldest = [*(tree.root_id for tree in reversed(live)), early.root_id, big]
    pages: dict[str, tuple[dict[str, Any], list[uuid.UUID], int]] = {
        "all": ({"project_id": None, "limit": 50}, [*(tree.root_id for tree in reversed(live)), big], 5),
        "project": ({"project_id": project, "limit": 50}, [live[0].root_id, big], 5),
        "next page": ({"project_id": None, "limit": 50, "before": live[1].root_id}, [live[0].root_id, big], 5),
        "with archived": ({"project_id": None, "limit": 10, "include_archived": True}, newest_archived[:10], 20),
        "project's with archived": ({"project_id": project, "limit": 10, "include_archived": True},
                                    newest_archived[:10], 20),
        "with archived, next page": ({"project_id": None, "limit": 10, "include_archived": True,
                                      "before": archived[4].root_id}, [*newest_archived[-4:], *oldest], 20),
    }
    async with db.tx() as conn:
        # As the statistics were before the archive: the plan must not hang on how many of a
        # project's roots the planner thinks are archived (taken for none, it read every one).
        await conn.execute("ANALYZE sessions")
        await conn.execute("UPDATE sessions SET archived = true WHERE session_id = ANY(%s) OR tree_id = %s",
                           ([tree.root_id for tree in archived], early.tree_id))
        await conn.execute(PLANNED_AT_SCALE)
        for generic in (False, True):
            listed, read = {}, {}
            for what, (arguments, _, _) in pages.items():
                explaining = GenericPlanExplainingConnection(conn) if generic else ExplainingConnection(conn)
                listed[what] = [row["session_id"] for row in await sessions.list_roots(
                    explaining, scope, offset=0, **arguments)]  # type: ignore[arg-type]
                read[what] = [(rows_read(plan, "sessions"), indexes_read(plan, "sessions"))
                              for plan in explaining.plans]
            assert listed == {what: expected for what, (_, expected, _) in pages.items()}
            assert {what: all(rows <= pages[what][2] for rows, _ in plans) for what, plans in read.items()} == {
                what: True for what in pages}, (generic, read)
        # From an offset, across the two ranges.
        across = await sessions.list_roots(conn, scope, project_id=project, offset=295, limit=10,
                                           include_archived=True)
        everything = await sessions.list_roots(conn, scope, project_id=None, offset=0, limit=500, include_archived=True)
    assert [row["session_id"] for row in across] == [*newest_archived[-5:], live[0].root_id, big]
    assert [row["session_id"] for row in everything] == [*newest_archived, *oldest]


async def test_a_page_of_a_projects_sessions_reads_that_page(db: Database, scope: Scope) -> None:
    """The list_sessions tool's scope "project" lists sessions by tree and path, a page at a time: each
    page sorted every session of the project, or walked every tree's paths (any project's) to find it."""
    trees = [await _tree_of(db, scope, members=40) for _ in range(12)]
    async with db.tx() as conn:
        await conn.execute("ANALYZE sessions")
        await conn.execute(PLANNED_AT_SCALE)
        # Nor the project's 41 sessions gathered by bitmaps and sorted, as cheap here as a page: not
        # for a project of thousands.
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        explaining = ExplainingConnection(conn)
        listed = {tree.tree_id: await sessions.list_project_sessions(explaining, scope,  # type: ignore[arg-type]
                                                                     tree.project_id, offset=0, limit=10)
                  for tree in trees}
    assert {tree_id: [row["path"] for row in page] for tree_id, page in listed.items()} == {
        tree.tree_id: ["/root", *(f"/root/m{index:03d}" for index in range(9))] for tree in trees}
    assert [rows_read(plan, "sessions") <= 10 for plan in explaining.plans] == [True] * len(trees), \
        [(rows_read(plan, "sessions"), indexes_read(plan, "sessions")) for plan in explaining.plans]
