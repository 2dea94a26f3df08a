"""Scratch databases for suites and benchmarks: a new database with Canopy's schema on a server."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from persistence.migrations import ensure_schema


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
