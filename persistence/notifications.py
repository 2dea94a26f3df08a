"""PostgreSQL notifications: hints that wake listeners at once (API replicas' live streams).

A notification is never a fact: a listener that missed one re-reads the durable rows.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from persistence.db import query


async def notify(conn: psycopg.AsyncConnection[Any], channel: str, payload: str) -> None:
    """Send ``payload`` on ``channel``, delivered when ``conn``'s transaction commits."""
    await conn.execute(query("notify"), {"channel": channel, "payload": payload})


async def listen(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    """Subscribe ``conn`` (an autocommit connection: one that stays open to receive) to ``channel``."""
    await conn.execute(sql.SQL(query("listen")).format(channel=sql.Identifier(channel)))
