"""Who watches a tree's live model text, so that unwatched model calls are not streamed.

Streaming a reply costs the ModelGateway several times the CPU of a plain call (litellm
handles every chunk) and a NOTIFY per burst of text. Text deltas are only a live view, so
they are produced only while someone can see them: an API stream that asks for deltas
marks its tree as watched until a time and refreshes the mark while it stays connected.
A Run reads the mark at each model boundary (queries/model_boundary.sql); a watcher that
arrives during a model call sees the text from the next call on (the committed message
arrives either way).
"""

from __future__ import annotations

import uuid

from persistence.db import Connection

_WATCH = """
INSERT INTO stream_watchers (tree_id, watched_until) VALUES (%s, now() + make_interval(secs => %s))
ON CONFLICT (tree_id) DO UPDATE SET watched_until = greatest(stream_watchers.watched_until, excluded.watched_until)
"""


async def watch(conn: Connection, tree_id: uuid.UUID, seconds: float) -> None:
    """Mark the tree as watched for ``seconds`` from now (never shortening an existing mark)."""
    await conn.execute(_WATCH, (tree_id, seconds))


async def delete_expired(conn: Connection) -> None:
    await conn.execute("DELETE FROM stream_watchers WHERE watched_until < now()")
