"""Databases for test suites and benchmarks: a scratch database with Canopy's schema on a server, and
rows read back from one.

They live in the product, not in ``tests/``, because the benchmarks use them too and the product
never imports its tests.
"""

from __future__ import annotations

import uuid
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from persistence.db import Database
from persistence.migrations import ensure_schema
from persistence.records import Row


def create_database(server_url: str, prefix: str, *, schema: bool = True) -> str:
    """A new database named ``<prefix>_<random>`` on ``server_url``'s server, Canopy's schema applied
    unless ``schema`` is False; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=name)
    if schema:
        ensure_schema(url)
    return url


def drop_database(url: str) -> None:
    """Drop the database ``url`` names (connected through the server's ``postgres`` database)."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(psycopg.conninfo.make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name))))


async def rows(db: Database, query: LiteralString, *params: Any) -> list[Row]:
    """The rows of one read-only query of a suite or benchmark, in a transaction of its own."""
    async with db.tx() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()
