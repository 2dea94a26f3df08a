"""Scheduled inputs: a schedule submits its input text to its session at each due time, exactly once.

A due time fires in one transaction that locks the schedule row (``SKIP LOCKED``: several
sweepers never wait on each other), records the firing under the key (schedule, due time), submits
the input with origin ``schedule`` and moves the schedule to its next due time: a crash before the
commit fires it again later, a crash after it finds it fired, and no due time fires twice.

Due times missed while nothing ran (everything down, or the sweep late) follow the schedule's
``catch_up``: ``once`` (the default) fires once for all of them — at the latest missed due time —
then continues from now; ``all`` fires each of them, oldest first; ``skip`` fires none and continues
from now (the latest of them is on time, and fires, when it is the sweep's period late or less). A
due time whose input cannot be given (its session is archived, or waits for a human) is recorded
with the reason and skipped. A cron expression has five fields: croniter's sixth (seconds) and
seventh (a year) would allow a rule that comes due once, or never. A rule that has no due time after
one it fired (one stored before that was checked) ends the schedule as a delete does, so it never
holds its place at the head of the due schedules.

The inputs a schedule has waiting in its session's queue are bounded: a session busy for hours, or a
tree stopped, would otherwise collect one per due time (a per-second rule with a long text is
megabytes a minute). While one waits, a due time of a ``once`` or ``skip`` schedule is recorded as
skipped for that reason, as a cron job that must not overlap is. An ``all`` schedule may have
``ALL_WAITING`` waiting (a backlog is caught up faster than one per sweep); then it holds its due
time until the session takes one in, so it still gives every one, and it leaves the head of the due
list to the others meanwhile. While the session's queue is full of other inputs it holds its due
time too, out of the due list until the queue has room (it recorded a refused firing for every due
time of its backlog).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import uuid
from typing import Any

from croniter import CroniterBadDateError, croniter

from persistence import turns
from persistence.db import Connection, query, savepoint
from persistence.errors import CanopyError, Conflict, InvalidArgument, LimitReached, NotFound
from persistence.records import Row, Scope, new_id
from persistence.sessions import get_session_row
from persistence.settings import get_settings

CATCH_UP = ("once", "all", "skip")
MIN_INTERVAL_SECONDS = 1.0
# An element is "R", "R(a-b)", "R/5", ...: an R that starts an element and no name (none starts so).
_RANDOM = re.compile(r"(?:^|[\s,])R(?![a-z])", re.IGNORECASE)
ALL_WAITING = 20


@dataclasses.dataclass(frozen=True)
class Rule:
    """When a schedule is due: a cron expression (UTC) or a fixed interval."""

    cron: str | None = None
    interval_seconds: float | None = None

    def check(self) -> None:
        if (self.cron is None) == (self.interval_seconds is None):
            raise InvalidArgument("a schedule has exactly one of cron and every_seconds")
        if self.interval_seconds is not None and self.interval_seconds < MIN_INTERVAL_SECONDS:
            raise InvalidArgument(f"every_seconds must be at least {MIN_INTERVAL_SECONDS:g}")
        if self.cron is not None and (len(self.cron.split()) != 5 or not croniter.is_valid(self.cron)):
            raise InvalidArgument(f"{self.cron!r} is not a cron expression "
                                  "(five fields: minute hour day-of-month month day-of-week, UTC)")
        if self.cron is not None and _RANDOM.search(self.cron):
            raise InvalidArgument(f"{self.cron!r} has a random field (R), whose value croniter draws again at every "
                                  "reading: the schedule would fire at other times each time; choose the values")

    def after(self, moment: datetime.datetime) -> datetime.datetime | None:
        """The first due time strictly after ``moment``; None if there is none."""
        if self.interval_seconds is not None:
            return moment + datetime.timedelta(seconds=self.interval_seconds)
        assert self.cron is not None
        try:
            # In UTC whatever the database's TimeZone (psycopg hands timestamps back in it): a cron
            # schedule in a local zone moves with its daylight saving, and fires twice in autumn.
            return croniter(self.cron, moment.astimezone(datetime.UTC)).get_next(datetime.datetime)
        except CroniterBadDateError:  # no match within croniter's search horizon (decades)
            return None

    def latest(self, due: datetime.datetime, now: datetime.datetime) -> datetime.datetime:
        """The last due time at or before ``now``, ``due`` (at or before ``now``) being one: in constant
        time however many were missed (stepping through them, a per-minute rule down for days held
        the sweep for seconds)."""
        if self.interval_seconds is not None:
            interval = datetime.timedelta(seconds=self.interval_seconds)
            latest = due + (now - due) // interval * interval
            return latest - interval if latest > now else latest  # a microsecond's rounding
        assert self.cron is not None
        # get_prev gives the last due time strictly before its start.
        start = (now + datetime.timedelta(microseconds=1)).astimezone(datetime.UTC)
        return max(due, croniter(self.cron, start).get_prev(datetime.datetime))


def _rule(row: Row) -> Rule:
    return Rule(row["cron"], row["interval_seconds"])


async def create_schedule(conn: Connection, scope: Scope, session_id: uuid.UUID, rule: Rule, text: str,
                          catch_up: str = "once") -> Row:
    """A new schedule of a session in the scope; its first due time is the rule's first after now."""
    rule.check()
    turns.check_text(text, "input text")
    if catch_up not in CATCH_UP:
        raise InvalidArgument(f"catch_up must be one of {', '.join(CATCH_UP)}")
    session = await get_session_row(conn, scope, session_id)  # NotFound for another scope's session
    # Read again under a share of the tree's row, which an archive holds for update until it has
    # ended the tree's schedules: one that committed meanwhile is seen here, and no schedule is
    # added behind it to a tree that takes no input.
    cur = await conn.execute(query("tree_archived_shared"), {"tree_id": session["tree_id"]})
    if session["archived"] or (await cur.fetchone() or {}).get("archived"):
        raise Conflict(f"session {session_id} is archived: it takes no input, so no schedule either")
    cur = await conn.execute(query("database_now"))
    now = (await cur.fetchone() or {})["now"]
    first = rule.after(now)
    if first is None:
        raise InvalidArgument(f"{rule.cron!r} never comes due (no date matches all its fields)")
    cur = await conn.execute(query("schedule_insert"), {
        "schedule_id": new_id(), "user_id": scope.user_id, "app_id": scope.app_id, "session_id": session_id,
        "cron": rule.cron, "interval_seconds": rule.interval_seconds, "input_text": text, "catch_up": catch_up,
        "next_due_at": first})
    row = await cur.fetchone()
    assert row is not None
    return row


async def list_schedules(conn: Connection, scope: Scope, session_id: uuid.UUID) -> list[Row]:
    await get_session_row(conn, scope, session_id)
    cur = await conn.execute(query("schedules_of_session"), {"session_id": session_id, "user_id": scope.user_id,
                                                             "app_id": scope.app_id})
    return await cur.fetchall()


async def delete_schedule(conn: Connection, scope: Scope, session_id: uuid.UUID, schedule_id: uuid.UUID) -> None:
    cur = await conn.execute(query("schedule_delete"), {"schedule_id": schedule_id, "session_id": session_id,
                                                        "user_id": scope.user_id, "app_id": scope.app_id})
    if await cur.fetchone() is None:
        raise NotFound(f"no schedule {schedule_id} of session {session_id}")


async def end_tree_schedules(conn: Connection, tree_id: uuid.UUID) -> None:
    """End the live schedules of a tree's sessions (an archived tree takes no input); their firings
    stay on record and their places in the scope's quota are free again."""
    await conn.execute(query("schedules_end_of_tree"), {"tree_id": tree_id})


async def due_schedules(conn: Connection, limit: int = 100) -> list[uuid.UUID]:
    """Schedules with a due time that has come, what the sweep fires: each scope in turn (every
    scope's soonest, then every scope's second, ...), soonest first within a turn."""
    cur = await conn.execute(query("schedules_due"), {"limit": limit, "window": ALL_WAITING,
                                                      "queue_limit": get_settings().max_pending_inputs})
    return [row["schedule_id"] for row in await cur.fetchall()]


async def fire_due(conn: Connection, schedule_id: uuid.UUID, punctuality: float = 0.0) -> Row | None:
    """Fire the schedule's due time if it has come and nobody else is firing it (see the module
    docstring); returns the firing (with the input receipt, or the error) or None. ``punctuality``:
    the seconds by which the caller may come late (a sweep's period): a ``skip`` schedule's latest
    due time that late is on time, not missed (else one whose interval is shorter than the sweep's
    period never fires)."""
    cur = await conn.execute(query("schedule_lock_due"), {"schedule_id": schedule_id, "window": ALL_WAITING})
    schedule = await cur.fetchone()
    if schedule is None or (schedule["catch_up"] == "all" and schedule["inputs_waiting"] >= ALL_WAITING):
        return None
    if schedule["archived"]:  # archiving ends a tree's schedules; one left live is ended, not fired for ever
        await _advance(conn, schedule_id, None)
        return None
    rule, now, due = _rule(schedule), schedule["now"], schedule["next_due_at"]
    if schedule["catch_up"] != "all":  # missed due times collapse into the latest (once) or none (skip)
        due = rule.latest(due, now)
    following = rule.after(due)
    missed = schedule["next_due_at"] < due and (now - due).total_seconds() > punctuality
    if schedule["catch_up"] == "skip" and missed:
        await _advance(conn, schedule_id, following)
        return None
    scope = Scope(schedule["user_id"], schedule["app_id"])
    origin: dict[str, Any] = {"kind": "schedule", "schedule_id": str(schedule_id), "due_at": due.isoformat()}
    receipt: Row | None = None
    error: str | None = None
    if schedule["inputs_waiting"] and schedule["catch_up"] != "all":
        error = "the input of an earlier due time still waits in the session's queue"
    else:
        try:
            async with savepoint(conn):  # a refused input changes nothing but the firing's record
                receipt = await turns.submit_input(conn, scope, schedule["session_id"], schedule["input_text"],
                                                   origin)
        except CanopyError as refused:
            if isinstance(refused, LimitReached) and schedule["catch_up"] == "all":
                return None  # a queue full of other inputs: the due time is held, as for its own inputs
            error = str(refused)
    await conn.execute(query("schedule_firing_insert"), {
        "schedule_id": schedule_id, "due_at": due, "input_id": receipt["input_id"] if receipt else None,
        "error": error})
    await _advance(conn, schedule_id, following)
    return {"schedule_id": schedule_id, "session_id": schedule["session_id"], "tree_id": schedule["tree_id"],
            "due_at": due, "receipt": receipt, "error": error}


async def _advance(conn: Connection, schedule_id: uuid.UUID, next_due: datetime.datetime | None) -> None:
    if next_due is None:
        await conn.execute(query("schedule_end"), {"schedule_id": schedule_id})
    else:
        await conn.execute(query("schedule_advance"), {"schedule_id": schedule_id, "next_due_at": next_due})
