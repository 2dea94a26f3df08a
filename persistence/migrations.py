"""Schema versions: a new database gets ``schema.sql``; an existing one is migrated forward.

``schema.sql`` is the whole schema at the latest version. ``migrations/NNNN_topic.sql`` takes
a database from version NNNN - 1 to NNNN; the latest version is the highest NNNN (2, the
first schema that shipped, when there is none). Migrations are forward-only and each runs
in a transaction of its own, recorded in ``schema_version`` in that same transaction, so a
crash mid-way leaves the database at the last version that committed. Every process that
starts runs ``ensure_schema`` under one advisory lock: the first applies what is missing,
the others find it done.

A migration must leave the database exactly as ``schema.sql`` would make it (the test
``tests/persistence/test_migrations.py`` compares the catalogs of both).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import LiteralString, cast

import psycopg

from persistence.db import query, tcp_bounds
from persistence.errors import DatabaseUnreachable

_HERE = Path(__file__).parent
_MIGRATIONS = _HERE / "migrations"
_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
# The version of the first schema that shipped, before there were migrations.
BASE_VERSION = 2
# A database that does not answer within this is reported as unreachable, not waited for.
CONNECT_TIMEOUT_SECONDS = 10
# Serialises schema changes between processes that start at the same time.
_SCHEMA_LOCK_KEY = 0x43414E4F5059  # "CANOPY"


class SchemaError(RuntimeError):
    """The database's schema cannot be used by this Canopy (it is newer, or a migration failed)."""


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    path: Path

    @property
    def sql(self) -> LiteralString:
        return cast(LiteralString, self.path.read_text())


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration, oldest first; their versions follow each other from BASE_VERSION + 1."""
    found = []
    for path in sorted(_MIGRATIONS.glob("*.sql")):
        match = _NAME.fullmatch(path.name)
        if match is None:
            raise SchemaError(f"migration file {path.name} is not named NNNN_topic.sql")
        found.append(Migration(int(match.group(1)), path))
    expected = list(range(BASE_VERSION + 1, BASE_VERSION + 1 + len(found)))
    if [m.version for m in found] != expected:
        raise SchemaError(f"migration versions {[m.version for m in found]} do not follow {BASE_VERSION}")
    return tuple(found)


def latest_version() -> int:
    found = migrations()
    return found[-1].version if found else BASE_VERSION


def current_version(conn: psycopg.Connection) -> int | None:
    """The database's schema version; None for a database without Canopy's schema."""
    exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        return None
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else None


def server_version(conn: psycopg.Connection) -> str:
    """The server's PostgreSQL version, as it spells it ("?" if it does not say)."""
    row = conn.execute(query("server_version")).fetchone()
    return str(row[0]) if row else "?"


def connect(url: str) -> psycopg.Connection:
    """An autocommit connection to ``url``; ``DatabaseUnreachable`` (which says why, without the
    password) when there is none."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS, **tcp_bounds(url))
    except psycopg.OperationalError as error:
        # Not chained: libpq's own text may quote part of a password it misread as a host.
        raise DatabaseUnreachable(url, connect_failure(error)) from None
    except psycopg.ProgrammingError:
        # libpq cannot read the URL, and its sentence quotes the part it could not (the password's
        # stray "%" or space, say): neither that sentence nor the URL may be shown.
        raise DatabaseUnreachable(url, "libpq cannot read this URL (a character of the password or another part "
                                       "needs percent-encoding?)") from None


def connect_failure(error: BaseException) -> str:
    """libpq's reason, without the addresses it tried: the last clause of its first line
    (``connection refused``, ``password authentication failed for user "x"``, ...)."""
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reason = re.sub(r"^\[Errno -?\d+\]\s*", "", re.split(r":\s+", first_line)[-1].strip())
    return reason[:1].lower() + reason[1:] if reason[:2] != reason[:2].upper() else reason


def ensure_schema(url: str) -> bool:
    """Create the schema in an empty database, or migrate an older one; True if anything changed."""
    with connect(url) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK_KEY,))
        try:
            version = current_version(conn)
            if version is None:
                with conn.transaction():
                    conn.execute(cast(LiteralString, (_HERE / "schema.sql").read_text()))
                    conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (latest_version(),))
                return True
            if version > latest_version():
                raise SchemaError(f"the database has schema version {version}, newer than this Canopy's "
                                  f"{latest_version()}: upgrade Canopy")
            return _migrate(conn, version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK_KEY,))


def _migrate(conn: psycopg.Connection, version: int) -> bool:
    due = [m for m in migrations() if m.version > version]
    for migration in due:
        try:
            with conn.transaction():
                conn.execute(migration.sql)
                conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (migration.version,))
        except psycopg.Error as error:
            raise SchemaError(f"migration {migration.path.name} failed: {error}") from error
    return bool(due)
