"""A database made by the first shipped schema and then migrated equals a fresh one.

``data/schema_v2.sql`` is the schema as it shipped at version 2, the first version with
migrations; an existing database is at that version or later. The comparison reads the
catalog (columns, constraints, indexes, functions, triggers) of both databases, so a
migration that forgets a default, an index or a constraint fails here.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from persistence.databases import create_database, drop_database
from persistence.migrations import SchemaError, ensure_schema, latest_version, migrations

_V2 = Path(__file__).parent / "data" / "schema_v2.sql"
# Rows a version-2 database holds, so each migration also proves it works on a filled database.
_V2_ROWS = """
INSERT INTO scopes (user_id, app_id) VALUES ('u', 'a');
INSERT INTO api_keys (key_hash, user_id, app_id) VALUES ('h', 'u', 'a');
INSERT INTO projects (project_id, user_id, app_id, name, workdir)
VALUES ('00000000-0000-0000-0000-000000000001', 'u', 'a', 'p', '/tmp/p');
INSERT INTO trees (tree_id, user_id, app_id, project_id, slot_limit)
VALUES ('00000000-0000-0000-0000-0000000000aa', 'u', 'a', '00000000-0000-0000-0000-000000000001', 4);
INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, name, path, depth, agent_config)
VALUES ('00000000-0000-0000-0000-0000000000aa', '00000000-0000-0000-0000-0000000000aa', 'u', 'a',
        '00000000-0000-0000-0000-000000000001', 'root', '/root', 0, '{}');
INSERT INTO inputs (input_id, session_id, user_id, app_id, text, origin)
VALUES ('00000000-0000-0000-0000-0000000000b1', '00000000-0000-0000-0000-0000000000aa', 'u', 'a', 'hi',
        '{"kind": "human"}');
INSERT INTO turns (turn_id, session_id, input_id)
VALUES ('00000000-0000-0000-0000-0000000000c1', '00000000-0000-0000-0000-0000000000aa',
        '00000000-0000-0000-0000-0000000000b1');
INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind)
VALUES ('00000000-0000-0000-0000-0000000000d1', '00000000-0000-0000-0000-0000000000c1',
        '00000000-0000-0000-0000-0000000000aa', '00000000-0000-0000-0000-0000000000aa', 'start');
"""

_COLUMNS = """
SELECT c.relname AS table_name, a.attname AS column_name, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull AS not_null, a.attidentity AS identity, pg_get_expr(d.adbin, d.adrelid) AS default_value
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
"""
_CONSTRAINTS = """
SELECT c.relname AS table_name, k.conname AS name, pg_get_constraintdef(k.oid) AS definition
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public'
"""
_INDEXES = "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
_FUNCTIONS = """
SELECT p.proname AS name, pg_get_functiondef(p.oid) AS definition
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
"""
_TRIGGERS = """
SELECT c.relname AS table_name, t.tgname AS name, pg_get_triggerdef(t.oid) AS definition
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND NOT t.tgisinternal
"""


def _catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything the schema defines, as sorted rows (column order within a table is not compared:
    a migration can only add a column at the end)."""
    with psycopg.connect(url) as conn:
        return {name: sorted(tuple(row) for row in conn.execute(query).fetchall())
                for name, query in (("columns", _COLUMNS), ("constraints", _CONSTRAINTS), ("indexes", _INDEXES),
                                    ("functions", _FUNCTIONS), ("triggers", _TRIGGERS))}


def _new_v2_database(server_url: str) -> str:
    url = create_database(server_url, "canopy_v2", schema=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_V2.read_text())  # type: ignore[arg-type]
        conn.execute(_V2_ROWS)
    return url


def test_a_migrated_version_2_database_equals_a_fresh_one(database_url: str) -> None:
    fresh = create_database(database_url, "canopy_fresh")
    old = _new_v2_database(database_url)
    try:
        assert ensure_schema(old) is bool(migrations())
        fresh_catalog, migrated_catalog = _catalog(fresh), _catalog(old)
        for part in fresh_catalog:
            missing = set(fresh_catalog[part]) - set(migrated_catalog[part])
            extra = set(migrated_catalog[part]) - set(fresh_catalog[part])
            assert not missing and not extra, f"{part}: missing after migration {missing}, extra {extra}"
        with psycopg.connect(old) as conn:
            versions = [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY version")]
            kept = conn.execute("SELECT count(*) FROM runs").fetchone()
        assert versions == list(range(2, latest_version() + 1))
        assert kept == (1,)  # the rows it held are still there
        assert ensure_schema(old) is False  # nothing left to do
    finally:
        drop_database(fresh)
        drop_database(old)


# Charges of an earlier Canopy: the root's two Runs (its second resumed the first), and a child's Run
# charged only for a summary, which counted no model call before migration 0009 counted replies.
_CHARGED_ROWS = """
UPDATE runs SET prompt_tokens = 100, completion_tokens = 10, cost_usd = 0.01, model_calls = 2
WHERE run_id = '00000000-0000-0000-0000-0000000000d1';
INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, resumes_run_id, prompt_tokens, model_calls)
VALUES ('00000000-0000-0000-0000-0000000000d2', '00000000-0000-0000-0000-0000000000c1',
        '00000000-0000-0000-0000-0000000000aa', '00000000-0000-0000-0000-0000000000aa', 'resume',
        '00000000-0000-0000-0000-0000000000d1', 50, 1);
INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, parent_id, name, path, depth, agent_config)
VALUES ('00000000-0000-0000-0000-0000000000bb', '00000000-0000-0000-0000-0000000000aa', 'u', 'a',
        '00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-0000000000aa', 'bb', '/root/bb', 1, '{}');
INSERT INTO inputs (input_id, session_id, user_id, app_id, text, origin)
VALUES ('00000000-0000-0000-0000-0000000000b2', '00000000-0000-0000-0000-0000000000bb', 'u', 'a', 'hi',
        '{"kind": "human"}');
INSERT INTO turns (turn_id, session_id, input_id)
VALUES ('00000000-0000-0000-0000-0000000000c2', '00000000-0000-0000-0000-0000000000bb',
        '00000000-0000-0000-0000-0000000000b2');
INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, prompt_tokens, completion_tokens, cost_usd)
VALUES ('00000000-0000-0000-0000-0000000000d3', '00000000-0000-0000-0000-0000000000c2',
        '00000000-0000-0000-0000-0000000000bb', '00000000-0000-0000-0000-0000000000aa', 'start', 40, 4, 0.002);
"""


def test_the_members_usage_is_their_runs_sum_after_the_migration_that_keeps_it(database_url: str) -> None:
    """A member's usage became a row of its own (migration 0038): a database of an earlier Canopy
    gets each member's row summed from its Runs, a summary's charge without a model call too."""
    url = _new_v2_database(database_url)
    keeping = next(m.version for m in migrations() if m.path.name.endswith("_session_usage.sql"))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for migration in migrations():
                if migration.version < keeping:
                    conn.execute(migration.sql)
                    conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (migration.version,))
            conn.execute(_CHARGED_ROWS)  # type: ignore[arg-type]
        assert ensure_schema(url) is True
        with psycopg.connect(url) as conn:
            usage = conn.execute("SELECT session_id::text, prompt_tokens, completion_tokens, "
                                 "round(cost_usd::numeric, 6), model_calls FROM session_usage "
                                 "ORDER BY session_id").fetchall()
        assert usage == [("00000000-0000-0000-0000-0000000000aa", 150, 10, Decimal("0.010000"), 3),
                         ("00000000-0000-0000-0000-0000000000bb", 40, 4, Decimal("0.002000"), 0)]
    finally:
        drop_database(url)


def test_a_database_newer_than_this_canopy_is_refused_and_left_alone(database_url: str) -> None:
    url = create_database(database_url, "canopy_newer")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (latest_version() + 1,))
        before = _catalog(url)
        with pytest.raises(SchemaError, match="newer than this Canopy"):
            ensure_schema(url)
        assert _catalog(url) == before
    finally:
        drop_database(url)
