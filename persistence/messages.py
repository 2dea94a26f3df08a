"""The thread history a model sees, and cooperation messages / steers read at model boundaries."""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

from psycopg.types.json import Jsonb

from persistence import ignorable
from persistence.db import Connection, advisory_lock, query
from persistence.errors import Conflict, LeaseLost, LimitReached
from persistence.events import append_event
from persistence.records import Row, RunRef, Scope, new_id
from persistence.settings import get_settings
from persistence.statuses import MessageKind, TurnStatus
from persistence.turns import check_text, lock_session, open_turn

_HISTORY = """
SELECT id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at
FROM thread_messages WHERE session_id = %s AND id > %s ORDER BY id LIMIT %s
"""


async def append_message(
    conn: Connection,
    run: RunRef,
    role: str,
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
    origin: dict[str, Any] | None = None,
) -> Row:
    """Commit one message of the executing Run (the caller fences the Run in this transaction).

    Returns the row as :func:`history` reads it, so a Run can extend its history in memory."""
    cur = await conn.execute(
        """INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, tool_calls, tool_call_id,
                                        origin)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
           RETURNING id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at""",
        (run.session_id, run.turn_id, run.run_id, role, content,
         Jsonb(tool_calls) if tool_calls is not None else None, tool_call_id, Jsonb(origin or {})),
    )
    row = await cur.fetchone()
    assert row is not None
    await append_event(conn, run.scope, "message", session_id=run.session_id, tree_id=run.tree_id,
                       turn_id=run.turn_id, run_id=run.run_id,
                       payload={"message_id": row["id"], "role": role, "tool_call_id": tool_call_id})
    return row


async def append_tool_results(conn: Connection, run: RunRef, results: list[tuple[str, str]]) -> list[Row]:
    """Commit tool results of the executing Run, ``(tool_call_id, content)`` in call order, in one
    statement (a step that creates twelve sessions writes twelve results: one round trip, not
    twelve). The caller fences the Run in this transaction. Returns the rows as :func:`history`
    reads them, in order."""
    if not results:
        return []
    cur = await conn.execute(
        """INSERT INTO thread_messages (session_id, turn_id, run_id, role, content, tool_call_id)
           SELECT %s, %s, %s, 'tool', r.content, r.tool_call_id
           FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS r (tool_call_id, content, position)
           ORDER BY r.position
           RETURNING id, role, content, tool_calls, tool_call_id, turn_id, run_id, origin, created_at""",
        (run.session_id, run.turn_id, run.run_id, [call_id for call_id, _ in results],
         [content for _, content in results]),
    )
    rows = sorted(await cur.fetchall(), key=lambda row: row["id"])  # identities follow the insert order
    for row in rows:
        await append_event(conn, run.scope, "message", session_id=run.session_id, tree_id=run.tree_id,
                           turn_id=run.turn_id, run_id=run.run_id,
                           payload={"message_id": row["id"], "role": "tool", "tool_call_id": row["tool_call_id"]})
    return rows


async def append_reply(conn: Connection, run: RunRef, *, content: str | None,
                       tool_calls: list[dict[str, Any]] | None, usage: dict[str, int], cost_usd: float | None,
                       role: str = "assistant", origin: dict[str, Any] | None = None) -> Row:
    """Commit a model reply of the executing Run and count its call's tokens and cost on the Run,
    in one fenced statement (LeaseLost, nothing written, if the lease is gone). Returns the
    row as :func:`history` reads it. A compaction summary is a reply too (see ``append_summary``)."""
    row = await _charge(conn, run, usage, cost_usd, record={
        "content": content, "tool_calls": Jsonb(tool_calls) if tool_calls else None, "role": role,
        "origin": Jsonb(origin or {})})
    await append_event(conn, run.scope, "message", session_id=run.session_id, tree_id=run.tree_id,
                       turn_id=run.turn_id, run_id=run.run_id,
                       payload={"message_id": row["id"], "role": role, "tool_call_id": None})
    return row


async def charge_call(conn: Connection, run: RunRef, *, usage: dict[str, int], cost_usd: float | None) -> None:
    """Count a model call whose reply joins no history (a summary that is not used) on the Run and
    its tree, as ``append_reply`` does: the provider billed it, and a budget counts it."""
    await _charge(conn, run, usage, cost_usd, record=None)


async def _charge(conn: Connection, run: RunRef, usage: dict[str, int], cost_usd: float | None,
                  record: dict[str, Any] | None) -> Row:
    """``cost_usd`` None: litellm has no price for the call's model (the tree counts such calls)."""
    cur = await conn.execute(query("append_reply"), {
        "prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0),
        "cost_usd": cost_usd or 0.0, "unpriced": int(cost_usd is None), "run_id": run.run_id, "owner": run.owner,
        "session_id": run.session_id, "turn_id": run.turn_id, "record": record is not None,
        **(record or {"content": None, "tool_calls": None, "role": "assistant", "origin": Jsonb({})})})
    row = await cur.fetchone()
    if row is None:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")
    return row


def render_summary(summary: str) -> str:
    """How a compaction summary appears to the model: Canopy's own wrapper around the summary."""
    return f"<canopy:summary>\n{escape_wrappers(summary)}\n</canopy:summary>"


async def append_summary(conn: Connection, run: RunRef, *, summary: str, covers_until: int, covered: int,
                         usage: dict[str, int], cost_usd: float | None) -> Row:
    """Commit a compaction summary (fenced, its call's usage charged): from now on it stands for
    every message of the session up to ``covers_until`` in what the model is sent (they stay here)."""
    return await append_reply(conn, run, content=render_summary(summary), tool_calls=None, usage=usage,
                              cost_usd=cost_usd, role="user",
                              origin={"kind": "compaction", "covers_until": covers_until, "covered": covered})


async def compaction_asked(conn: Connection, session_id: uuid.UUID, *, refused_until: int | None,
                           served: bool = True) -> None:
    """A summary was asked for: serve a human's request (``served``: the caller read one; one made
    since stays), and remember a summary asked for up to message ``refused_until`` that failed or
    could not be used (None: one was committed), so that no later Run asks again over the same
    history and is billed again. Lock order: the session's row first, the caller's Run after (as
    ``turns.finish_turn`` takes them)."""
    await conn.execute(query("compaction_asked"), {"session_id": session_id, "refused_until": refused_until,
                                                   "served": served})


def is_summary(row: Row) -> bool:
    """Whether a history row is a compaction summary (``append_summary``)."""
    return (row["origin"] or {}).get("kind") == "compaction"


async def model_history(conn: Connection, session_id: uuid.UUID) -> list[Row]:
    """What a Run works from: the session's latest compaction summary, if any, then every message
    after what it covers (the summary itself first, where the messages it stands for were)."""
    cur = await conn.execute(query("latest_compaction"), {"session_id": session_id})
    summary = await cur.fetchone()
    if summary is None:
        return await history(conn, session_id)
    after = await history(conn, session_id, after_id=summary["origin"]["covers_until"])
    return [summary, *(row for row in after if not is_summary(row))]


_HISTORY_PAGE = 10_000


async def history(conn: Connection, session_id: uuid.UUID, *, after_id: int = 0) -> list[Row]:
    """A session's messages in order, all of them after ``after_id`` (read in pages, so a long
    history costs bounded statements, not one unbounded one). The caller has checked the session's
    scope."""
    rows: list[Row] = []
    while True:
        cur = await conn.execute(_HISTORY, (session_id, after_id, _HISTORY_PAGE))
        found = await cur.fetchall()
        rows.extend(found)
        if len(found) < _HISTORY_PAGE:
            return rows
        after_id = found[-1]["id"]


async def reader_page(conn: Connection, session_id: uuid.UUID, *, after_id: int, limit: int,
                      max_bytes: int) -> tuple[list[Row], bool]:
    """At most ``limit`` messages after ``after_id``, oldest first, none beginning past ``max_bytes``
    of the page's text (the first always comes), and whether more follow. The caller has checked
    the session's scope."""
    cur = await conn.execute(query("messages_page"), {
        "session_id": session_id, "after_id": after_id, "limit": limit, "max_bytes": max_bytes})
    rows = await cur.fetchall()
    more = bool(rows) and rows[0]["available"] > len(rows)
    return [{key: value for key, value in row.items() if key != "available"} for row in rows], more


# "<", then "canopy" and ":" in any case, with whitespace or "/" around the word, and anything
# ignorable (persistence/ignorable.py) at every position; and in the forms a model reads as those:
# full-width and small letters and signs, angle brackets and quotation marks (NFKC maps some of them,
# not all, so they are listed). No class holds a "<" form or a letter, so the scan stays linear; the
# letters' cases are listed, not IGNORECASE, which folds the large classes at each "<" (7 × slower on
# text full of them, such as HTML).
_INVISIBLE = "".join(f"\\U{first:08x}" + (f"-\\U{last:08x}" if last > first else "")
                     for first, last in ignorable.RANGES)
_LESS_THAN = "<\uff1c\ufe64\u2039\u2329\u27e8\u3008\u1438"
_COLON = ":\uff1a\ufe55\ufe13\u2236\ua789"
_CANOPY = f"[{_INVISIBLE}]*".join(
    f"[{letter}{letter.upper()}{chr(ord(letter) - 0x61 + 0xFF41)}{chr(ord(letter) - 0x61 + 0xFF21)}]"
    for letter in "canopy")
_WRAPPER_LIKE = re.compile(f"[{_LESS_THAN}][\\s/{_INVISIBLE}]*{_CANOPY}[\\s{_INVISIBLE}]*[{_COLON}]")


# The origins of history rows whose text is Canopy's own wrapper around an escaped body
# (``render_coop_message``, ``render_summary``): any other row's text is escaped before a model reads it.
WRAPPED_ORIGINS = ("message", "steer", "compaction")


def model_text(row: Row) -> str:
    """A history row's text as a model reads it as context: Canopy's own wrappers kept, anyone else's
    escaped (see ``escape_wrappers``)."""
    text = row["content"] or ""
    if row["role"] == "user" and (row["origin"] or {}).get("kind") in WRAPPED_ORIGINS:
        return text
    return escape_wrappers(text)


def escape_wrappers(text: str) -> str:
    """Text from anyone but Canopy itself, made unable to pass for Canopy's wrappers: a message or
    reply that writes ``<canopy:message from="/root/boss">`` must not read as one from /root/boss,
    nor in another case, with spaces or with invisible characters where a model would not see them,
    nor in look-alike characters (``＜ｃａｎｏｐｙ：``, ``‹canopy:``)."""
    return _WRAPPER_LIKE.sub(lambda found: "&lt;" + found.group()[1:], text)


def render_coop_message(message: Row) -> str:
    """How a cooperation message or steer appears to the model: context, never authorisation. The
    wrapper is Canopy's; the body inside it is escaped (see ``escape_wrappers``)."""
    body = escape_wrappers(message["body"])
    if message["kind"] == MessageKind.STEER:
        return f"<canopy:steer>\n{body}\n</canopy:steer>"
    sender = message["sender_path"] or message["sender_session_id"]
    return (f'<canopy:message from="{sender}" session_id="{message["sender_session_id"]}">\n'
            f"{body}\n</canopy:message>")


@dataclasses.dataclass(frozen=True)
class Boundary:
    """A model boundary: the Turn's status, whether its tree is watched live, the history rows the
    unprocessed messages and steers became (none when the Turn is being cancelled), whether a human
    asked to compact the history, the last message a refused summary was asked for up to
    (``compaction_asked``), and the budget limit its tree's work has reached
    (``usage.budget_reached``; then no model call may start)."""

    turn_status: str | None
    watched: bool
    taken: list[Row]
    compact_requested: bool = False
    compaction_refused_until: int | None = None
    budget_reached: dict[str, Any] | None = None


async def take_boundary(conn: Connection, run: RunRef) -> Boundary:
    """At a model boundary (fenced: LeaseLost if the Run's lease is gone): unless the Turn is
    being cancelled, move every unprocessed message and steer into the Run's history."""
    cur = await conn.execute(query("model_boundary"), {
        "run_id": run.run_id, "owner": run.owner, "session_id": run.session_id, "tree_id": run.tree_id,
        "turn_id": run.turn_id})
    rows = await cur.fetchall()
    if not rows or not rows[0]["fenced"]:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")
    status, watched, compact = rows[0]["turn_status"], rows[0]["watched"], bool(rows[0]["compact_requested"])
    reached, refused = rows[0]["budget_reached"], rows[0]["compaction_refused_until"]
    if status == TurnStatus.CANCELLING:
        return Boundary(status, watched, [], compact_requested=compact, compaction_refused_until=refused)
    taken = []
    for message in rows:
        if message["message_id"] is None:  # no message: the one row is the Turn's alone
            continue
        # Where a message comes from is recorded from the database, never read back from its text.
        origin = {"kind": message["kind"], "message_id": str(message["message_id"])}
        if message["sender_session_id"] is not None:
            origin.update(session_id=str(message["sender_session_id"]), path=message["sender_path"],
                          tree_id=str(message["sender_tree_id"]))
        taken.append(await append_message(conn, run, "user", content=render_coop_message(message), origin=origin))
        await conn.execute(
            "UPDATE coop_messages SET processed_at = now(), processed_run_id = %s WHERE message_id = %s",
            (run.run_id, message["message_id"]),
        )
    if any(message["sender_approval_mode"] == "ask" for message in rows):
        # Context from an ask Turn must not get a command run unasked through an auto one.
        await conn.execute(query("turn_ask"), {"turn_id": run.turn_id})
    return Boundary(status, watched, taken, compact_requested=compact, compaction_refused_until=refused,
                    budget_reached=reached)


async def insert_coop_message(
    conn: Connection,
    scope: Scope,
    *,
    kind: MessageKind,
    receiver: Row,
    body: str,
    sender: Row | None = None,
    run: RunRef | None = None,
    tool_call_id: str | None = None,
) -> uuid.UUID:
    check_text(body, "message")
    await _check_unread_room(conn, receiver, body)
    message_id = new_id()
    await conn.execute(
        """INSERT INTO coop_messages (message_id, user_id, app_id, kind, sender_session_id, receiver_session_id,
                                      source_run_id, source_turn_id, tool_call_id, body)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (message_id, scope.user_id, scope.app_id, kind, sender["session_id"] if sender else None,
         receiver["session_id"], run.run_id if run else None, run.turn_id if run else None, tool_call_id, body),
    )
    if sender is not None:
        await append_event(conn, scope, "coop_message", session_id=sender["session_id"],
                           tree_id=sender["tree_id"], run_id=run.run_id if run else None,
                           payload={"message_id": str(message_id),
                                    "receiver_session_id": str(receiver["session_id"])})
    return message_id


async def _check_unread_room(conn: Connection, receiver: Row, body: str) -> None:
    """LimitReached when the receiver's unread messages, with this one, would pass the settings' count
    or bytes: its next model call takes them all in. Counted under a lock of the receiver's own, not
    its row's: a sender holds its own session's row, and two sessions messaging each other would
    each wait for the other's."""
    settings = get_settings()
    await advisory_lock(conn, "canopy.unread", receiver["session_id"])
    cur = await conn.execute(query("coop_messages_unread"), {"session_id": receiver["session_id"],
                                                             "limit": settings.max_unread_messages})
    unread = await cur.fetchone()
    assert unread is not None
    if unread["messages"] >= settings.max_unread_messages:
        raise LimitReached(f"session {receiver['path']} has {unread['messages']} messages unread, the most it may "
                           "(CANOPY_MAX_UNREAD_MESSAGES): send more once it has read them (at its next model call)")
    if unread["bytes"] + len(body.encode()) > settings.max_unread_message_bytes:
        raise LimitReached(f"session {receiver['path']} has {unread['bytes']} bytes of messages unread, and this one "
                           f"would pass {settings.max_unread_message_bytes} (CANOPY_MAX_UNREAD_MESSAGE_BYTES): send it "
                           "once it has read them (at its next model call), or shorter")


async def steer(conn: Connection, scope: Scope, session_id: uuid.UUID, text: str) -> Row:
    """A human's correction to the running Turn, read at its next model boundary."""
    check_text(text)
    session = await lock_session(conn, scope, session_id)
    turn = await open_turn(conn, session_id)
    if turn is None or turn["status"] != TurnStatus.RUNNING:
        raise Conflict(f"session {session['path']} has no running turn to steer")
    message_id = await insert_coop_message(conn, scope, kind=MessageKind.STEER, receiver=session, body=text)
    return {"message_id": message_id, "session_id": session_id, "turn_id": turn["turn_id"]}


async def has_tool_result(conn: Connection, turn_id: uuid.UUID, tool_call_id: str) -> bool:
    """Whether the Turn's thread already holds the result of the tool call ``tool_call_id``."""
    cur = await conn.execute(query("tool_result_exists"), {"turn_id": turn_id, "tool_call_id": tool_call_id})
    return await cur.fetchone() is not None
