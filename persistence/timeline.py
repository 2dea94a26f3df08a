"""A tree's timeline: every member's Runs, queued-for-slot intervals, waits, human requests,
model calls and tool calls, plus the stop/continue moments, derived from the durable facts.

Three statements whatever the tree's size (the tree, its members, the items). Items are ordered
by (start, kind, id) and paged by keyset: a :class:`Page` position says where the next page
starts, and carries the moment its first page was read, which is where a client's next
"what changed since" read begins.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import json
import uuid

from persistence.db import Connection, query
from persistence.errors import InvalidArgument
from persistence.records import Row, Scope
from persistence.text import why_unstorable
from persistence.views import require_tree

INSTANT_KINDS = frozenset({"stop", "continue"})
# The kinds timeline_items.sql reads (the API's TimelineInterval.kind lists the intervals' too).
INTERVAL_KINDS = frozenset({"run", "queued", "wait", "approval", "question", "model_call", "tool_call"})
KINDS = INSTANT_KINDS | INTERVAL_KINDS
# An interval's end is stamped inside its transaction, before the commit that makes it visible:
# a read "since T" also returns what ended a little before T, so an interval still open at the
# last read (and committed after it) is never missed. Longer than any Canopy transaction.
COMMIT_LAG = dt.timedelta(seconds=60)
MAX_CURSOR = 512  # characters of an encoded position


@dataclasses.dataclass(frozen=True)
class Page:
    """Where a read continues: the first page's time (``as_of``), its ``since`` filter, and the
    key (start, kind, id) of the last item returned."""

    as_of: dt.datetime
    since: dt.datetime | None
    after: tuple[dt.datetime, str, str]

    def encode(self) -> str:
        start, kind, item_id = self.after
        raw = [self.as_of.isoformat(), self.since.isoformat() if self.since else None, start.isoformat(), kind, item_id]
        return base64.urlsafe_b64encode(json.dumps(raw, separators=(",", ":")).encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str) -> Page:
        try:
            if len(cursor) > MAX_CURSOR:
                raise ValueError("too long")
            raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            as_of, since, start, kind, item_id = raw
            # The key goes to PostgreSQL as text: a cursor this API returned holds a known kind and a
            # storable id, and anything else (a lone surrogate, a NUL) would fail the statement.
            if kind not in KINDS or not isinstance(item_id, str) or why_unstorable(item_id) is not None:
                raise ValueError("bad key")
            return cls(_aware(as_of), _aware(since) if since is not None else None, (_aware(start), kind, item_id))
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as error:
            raise InvalidArgument("since is neither an ISO 8601 time nor a cursor this API returned") from error


def _aware(value: object) -> dt.datetime:
    if not isinstance(value, str):
        raise ValueError("not a time")
    moment = dt.datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _lagged(since: dt.datetime | None) -> dt.datetime | None:
    """``since`` less COMMIT_LAG; None (everything) for a moment so early that nothing precedes it."""
    try:
        return since - COMMIT_LAG if since else None
    except OverflowError:
        return None


def _ended_after(since: dt.datetime | None, after_start: dt.datetime | None) -> dt.datetime | None:
    """The earliest end of a Turn that may hold an item of the read: one ending at or after
    ``since`` (already lagged) and starting after ``after_start``, less COMMIT_LAG of slack. A
    Turn's end is its finishing transaction's start, which what that transaction stamps with the
    real moment (its Run's end, by clock_timestamp()) follows, and a model call the Turn's cancel
    aborted is recorded by its gateway as it ends, after the Turn."""
    bounds = [moment for moment in (since, after_start) if moment is not None]
    return _lagged(max(bounds)) if bounds else None


def parse_since(since: str | None) -> tuple[dt.datetime | None, Page | None]:
    """``since`` as the API takes it: None (everything), an ISO 8601 time (what may have changed
    since then; a time without an offset is UTC), or a cursor of a previous page."""
    if since is None or not since.strip():
        return None, None
    try:
        return _aware(since.strip()), None
    except ValueError:
        return None, Page.decode(since.strip())


async def timeline(conn: Connection, scope: Scope, tree_id: uuid.UUID, *, since: dt.datetime | None = None,
                   page: Page | None = None, limit: int | None = None) -> Row:
    """One page of the tree's timeline (NotFound when the tree is not in the scope).

    ``since``: only items still open or ended after that moment (minus COMMIT_LAG); ``page``:
    continue a previous read (its own ``since`` applies); ``limit``: None reads every item.
    Returns ``{tree_id, as_of, members, intervals, instants, next}`` where ``next`` is the
    position of the following page, or None after the last one.
    """
    await require_tree(conn, scope, tree_id)
    keys = {"tree_id": tree_id, "user_id": scope.user_id, "app_id": scope.app_id}
    cur = await conn.execute(query("timeline_members"), keys)
    members = await cur.fetchall()
    as_of = page.as_of if page else members[0]["as_of"]
    if page is not None:
        since = page.since
    after_start, after_kind, after_id = page.after if page else (None, None, None)
    lagged = _lagged(since)
    cur = await conn.execute(query("timeline_items"), {
        **keys, "since": lagged, "ended_after": _ended_after(lagged, after_start), "after_start": after_start,
        "after_kind": after_kind, "after_id": after_id, "limit": limit + 1 if limit is not None else None})
    items = await cur.fetchall()
    more = limit is not None and len(items) > limit
    items = items[:limit] if limit is not None else items
    last = items[-1] if items else None
    following = Page(as_of, since, (last["start_at"], last["kind"], last["id"])) if more and last else None
    return {
        "tree_id": tree_id,
        "as_of": as_of,
        "members": [{key: value for key, value in member.items() if key != "as_of"} for member in members],
        "intervals": [_interval(item) for item in items if item["kind"] not in INSTANT_KINDS],
        "instants": [{"kind": item["kind"], "id": item["id"], "session_id": item["session_id"], "at": item["start_at"]}
                     for item in items if item["kind"] in INSTANT_KINDS],
        "next": following,
    }


def _interval(item: Row) -> Row:
    interval = {key: value for key, value in item.items() if key not in ("start_at", "end_at", "targets")}
    return {**interval, "start": item["start_at"], "end": item["end_at"], "waits_on": item["targets"] or []}
