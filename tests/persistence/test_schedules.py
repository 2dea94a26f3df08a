"""Scheduled inputs: each due time gives exactly one input, whatever the number of sweepers; missed
due times follow the schedule's catch-up policy; a bad schedule is refused and changes nothing."""

from __future__ import annotations

import asyncio
import datetime
import uuid
import zoneinfo
from typing import Any

import pytest

from persistence import schedules, trees, turns
from persistence.db import Database
from persistence.errors import Conflict, InvalidArgument, NotFound
from persistence.records import Row, Scope
from persistence.settings import get_settings
from tests.persistence.helpers import claim_turn, count_rows, fetch_all, finish, make_tree, scalar, start_root_run


async def _due_in_the_past(db: Database, schedule_id: uuid.UUID, seconds_ago: float) -> None:
    async with db.tx() as conn:
        await conn.execute("UPDATE schedules SET next_due_at = now() - make_interval(secs => %s) "
                           "WHERE schedule_id = %s", (seconds_ago, schedule_id))


async def _fire_all(db: Database, schedule_id: uuid.UUID) -> list[dict[str, object]]:
    fired = []
    while True:
        async with db.tx() as conn:
            firing = await schedules.fire_due(conn, schedule_id)
        if firing is None:
            return fired
        fired.append(firing)


async def _inputs_of(db: Database, session_id: uuid.UUID) -> list[dict[str, object]]:
    return await fetch_all(db, "SELECT origin FROM inputs WHERE session_id = %s AND origin->>'kind' = 'schedule' "
                           "ORDER BY seq", (session_id,))


async def test_a_due_time_fires_once_however_many_sweepers_race(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60),
                                               "check the build")
    await _due_in_the_past(db, made["schedule_id"], 1)

    async def sweeper() -> object:
        async with db.tx() as conn:
            return await schedules.fire_due(conn, made["schedule_id"])

    outcomes = await asyncio.gather(*(sweeper() for _ in range(6)))
    assert sum(outcome is not None for outcome in outcomes) == 1
    fired = await _inputs_of(db, tree.root_id)
    assert len(fired) == 1 and fired[0]["origin"]["schedule_id"] == str(made["schedule_id"])
    async with db.tx() as conn:
        [listed] = await schedules.list_schedules(conn, scope, tree.root_id)
    assert listed["next_due_at"] > listed["last_due_at"]  # moved on to the next due time
    assert await _fire_all(db, made["schedule_id"]) == []  # not due again yet


@pytest.mark.parametrize(("catch_up", "expected"), [("once", 1), ("all", 5), ("skip", 0)])
async def test_missed_due_times_follow_the_catch_up_policy(db: Database, scope: Scope, catch_up: str,
                                                           expected: int) -> None:
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=10),
                                               "tick", catch_up)
    await _due_in_the_past(db, made["schedule_id"], 45)  # due 45, 35, 25, 15 and 5 s ago
    fired = await _fire_all(db, made["schedule_id"])
    assert len(fired) == expected
    due_times = [f["due_at"] for f in fired]
    assert len(set(due_times)) == len(due_times)
    assert len(await _inputs_of(db, tree.root_id)) == expected
    async with db.tx() as conn:
        [listed] = await schedules.list_schedules(conn, scope, tree.root_id)
        now = (await (await conn.execute("SELECT now() AS now")).fetchone() or {})["now"]
    assert now < listed["next_due_at"] <= now + datetime.timedelta(seconds=10)


async def test_a_skip_schedule_shorter_than_the_sweeps_period_still_fires(db: Database, scope: Scope) -> None:
    """Every sweep round (2 s apart) found a 1 s schedule's previous due time passed as well as the
    latest, so ``skip`` skipped them all, every round, and never fired: the latest due time within
    one sweep's period is on time; the ones before it are missed."""
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=1),
                                               "tick", "skip")
    await _due_in_the_past(db, made["schedule_id"], 1.5)  # due 1.5 and 0.5 s ago
    async with db.tx() as conn:
        fired = await schedules.fire_due(conn, made["schedule_id"], punctuality=2.0)
    assert fired is not None and fired["receipt"] is not None
    assert len(await _inputs_of(db, tree.root_id)) == 1
    async with db.tx() as conn:  # due again each second: out of the due list the other tests read
        await schedules.delete_schedule(conn, scope, tree.root_id, made["schedule_id"])


async def test_catching_up_on_all_holds_its_due_time_while_the_sessions_queue_is_full(
        db: Database, scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue full of other inputs refused each due time: an ``all`` schedule recorded every one as
    refused and moved on (a backlog of 100 such schedules: 2,000 firings a sweep round, each a row
    and a dropped due time). It holds its due time until the queue has room, and then gives it."""
    monkeypatch.setenv("CANOPY_MAX_PENDING_INPUTS", "2")
    get_settings.cache_clear()
    try:
        tree, busy = await start_root_run(db, scope)  # a running Turn: inputs wait in the queue
        async with db.tx() as conn:
            for text in ("one", "two"):
                await turns.submit_input(conn, scope, tree.root_id, text, {"kind": "human"})
            made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=10),
                                                   "tick", "all")
        await _due_in_the_past(db, made["schedule_id"], 25)  # due 25, 15 and 5 s ago
        due = await scalar(db, "SELECT next_due_at FROM schedules WHERE schedule_id = %s", (made["schedule_id"],))
        before = await count_rows(db)
        assert await _fire_all(db, made["schedule_id"]) == []
        assert await count_rows(db) == before  # no firing recorded, nothing moved
        assert await scalar(db, "SELECT next_due_at FROM schedules WHERE schedule_id = %s",
                            (made["schedule_id"],)) == due
        assert made["schedule_id"] not in await _due_list(db)  # and leaves the due list to the others

        await finish(db, busy)  # the Turn ends; the next takes "one" in: room for one input
        assert made["schedule_id"] in await _due_list(db)
        given = await _fire_all(db, made["schedule_id"])
        assert [f["due_at"] for f in given] == [due] and given[0]["error"] is None
        async with db.tx() as conn:  # held again (due): out of the due list the other tests read
            await schedules.delete_schedule(conn, scope, tree.root_id, made["schedule_id"])
    finally:
        get_settings.cache_clear()


async def _due_list(db: Database) -> list[uuid.UUID]:
    async with db.tx() as conn:
        return await schedules.due_schedules(conn)


async def test_catching_up_on_all_holds_its_due_times_while_its_inputs_wait(
        db: Database, scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedules, "ALL_WAITING", 2)
    tree, busy = await start_root_run(db, scope)  # a running Turn: each input waits in the queue
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=10),
                                               "tick", "all")
    await _due_in_the_past(db, made["schedule_id"], 45)  # due 45, 35, 25, 15 and 5 s ago
    given = [f["due_at"] for f in await _fire_all(db, made["schedule_id"])]
    assert len(given) == 2  # then it holds the next missed due time
    while len(given) < 5:
        assert made["schedule_id"] not in await _due_list(db)  # and leaves the due list to the others
        await finish(db, busy)  # the Turn ends; the next takes the oldest scheduled input in
        busy = await claim_turn(db, tree.tree_id, await scalar(
            db, "SELECT turn_id FROM turns WHERE session_id = %s AND status = 'running'", (tree.root_id,)))
        fired = await _fire_all(db, made["schedule_id"])
        assert len(fired) == 1
        given.append(fired[0]["due_at"])
    assert given == sorted(given) and len(set(given)) == 5  # every missed due time, oldest first
    assert len(await _inputs_of(db, tree.root_id)) == 5
    assert await _fire_all(db, made["schedule_id"]) == []  # caught up: the next due time is ahead


@pytest.mark.parametrize("catch_up", ["once", "skip"])
async def test_a_schedule_gives_no_input_while_its_last_one_waits(db: Database, scope: Scope,
                                                                 catch_up: str) -> None:
    """A session busy for hours (or a tree stopped) would otherwise collect one input per due time:
    a per-second rule with a long text is megabytes a minute in the queue."""
    tree, busy = await start_root_run(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60),
                                               "tick", catch_up)
    await _due_in_the_past(db, made["schedule_id"], 1)
    [first] = await _fire_all(db, made["schedule_id"])
    assert first["receipt"]["status"] == "queued"
    for _ in range(3):
        await _due_in_the_past(db, made["schedule_id"], 1)
        [skipped] = await _fire_all(db, made["schedule_id"])
        assert skipped["receipt"] is None and "still waits" in str(skipped["error"])
    assert len(await _inputs_of(db, tree.root_id)) == 1
    firings = await fetch_all(db, "SELECT input_id, error FROM schedule_firings WHERE schedule_id = %s "
                                  "ORDER BY due_at", (made["schedule_id"],))
    assert [f["input_id"] for f in firings] == [first["receipt"]["input_id"], None, None, None]

    await finish(db, busy)  # the queued input is taken in: the next due time gives one again
    await _due_in_the_past(db, made["schedule_id"], 1)
    [again] = await _fire_all(db, made["schedule_id"])
    assert again["receipt"] is not None and len(await _inputs_of(db, tree.root_id)) == 2


async def test_a_refused_input_is_recorded_and_skipped(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(cron="* * * * *"), "tick")
        # An input the session refuses (here a text stored before blank ones were refused).
        await conn.execute("UPDATE schedules SET input_text = ' ' WHERE schedule_id = %s", (made["schedule_id"],))
    await _due_in_the_past(db, made["schedule_id"], 1)
    [fired] = await _fire_all(db, made["schedule_id"])
    assert fired["receipt"] is None and "non-empty" in str(fired["error"])
    assert await _inputs_of(db, tree.root_id) == []
    firings = await fetch_all(db, "SELECT input_id, error FROM schedule_firings WHERE schedule_id = %s",
                              (made["schedule_id"],))
    assert len(firings) == 1 and firings[0]["input_id"] is None


@pytest.mark.parametrize("rule", [
    schedules.Rule(), schedules.Rule(cron="* * * * *", interval_seconds=5), schedules.Rule(interval_seconds=0.2),
    schedules.Rule(cron="every minute"),
    # croniter's extra fields (seconds, year): a year makes a schedule that can come due once.
    schedules.Rule(cron="* * * * * *"), schedules.Rule(cron="14 15 3 12 * 0 2026"),
    schedules.Rule(cron="0 0 30 2 *"),  # five valid fields that never come due
    # croniter's random fields: a value drawn again at every reading, so due times that move.
    schedules.Rule(cron="R R * * *"), schedules.Rule(cron="0 1,r(2-5) * * *"), schedules.Rule(cron="R/5 * * * *"),
    schedules.Rule(cron="0 r/2 * * *"),
])
async def test_a_bad_schedule_is_refused_and_writes_nothing(db: Database, scope: Scope,
                                                            rule: schedules.Rule) -> None:
    tree = await make_tree(db, scope)
    before = await count_rows(db)
    with pytest.raises(InvalidArgument):
        async with db.tx() as conn:
            await schedules.create_schedule(conn, scope, tree.root_id, rule, "tick")
    assert await count_rows(db) == before


async def test_a_schedule_with_no_further_due_time_fires_its_last_and_ends(db: Database, scope: Scope) -> None:
    """A rule with no due time after its last (a one-off stored before five fields were required):
    that due time fires once and the schedule ends, instead of failing every sweep while holding its
    place at the head of the due schedules."""
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(cron="* * * * *"), "once")
        other = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60),
                                                "every minute")
        now = (await (await conn.execute("SELECT now() AS now")).fetchone() or {})["now"]
    due = (now - datetime.timedelta(minutes=2)).replace(second=0, microsecond=0)
    one_off = f"{due.minute} {due.hour} {due.day} {due.month} * 0 {due.year}"
    async with db.tx() as conn:
        await conn.execute("UPDATE schedules SET cron = %s, next_due_at = %s WHERE schedule_id = %s",
                           (one_off, due, made["schedule_id"]))
    await _due_in_the_past(db, other["schedule_id"], 1)
    [fired] = await _fire_all(db, made["schedule_id"])
    assert fired["due_at"] == due and fired["error"] is None
    assert [i["origin"]["schedule_id"] for i in await _inputs_of(db, tree.root_id)] == [str(made["schedule_id"])]
    async with db.tx() as conn:
        # Every scope's due schedules are listed: another test's may be among them.
        due = await schedules.due_schedules(conn)
        assert {made["schedule_id"], other["schedule_id"]} & set(due) == {other["schedule_id"]}
        listed = await schedules.list_schedules(conn, scope, tree.root_id)
    assert [s["schedule_id"] for s in listed] == [other["schedule_id"]]
    assert await _fire_all(db, made["schedule_id"]) == []


async def test_another_scopes_session_has_no_schedules(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    other = Scope("someone-else", scope.app_id)
    with pytest.raises(NotFound):
        async with db.tx() as conn:
            await schedules.create_schedule(conn, other, tree.root_id, schedules.Rule(interval_seconds=5), "x")
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=5), "x")
    with pytest.raises(NotFound):
        async with db.tx() as conn:
            await schedules.delete_schedule(conn, other, tree.root_id, made["schedule_id"])
    async with db.tx() as conn:
        await schedules.delete_schedule(conn, scope, tree.root_id, made["schedule_id"])
        assert await schedules.list_schedules(conn, scope, tree.root_id) == []


async def test_cron_is_read_in_utc_whatever_the_databases_time_zone(db: Database, scope: Scope) -> None:
    """psycopg hands timestamps back in the connection's TimeZone, which initdb takes from the
    machine: "0 9 * * *" came due at 09:00 in New York, not at 09:00 UTC, and moved with its
    daylight saving."""
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        await conn.execute("SET LOCAL TimeZone = 'America/New_York'")
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(cron="0 9 * * *"), "tick")
    [row] = await fetch_all(db, "SELECT to_char(next_due_at AT TIME ZONE 'UTC', 'HH24:MI') AS due FROM schedules "
                                "WHERE schedule_id = %s", (made["schedule_id"],))
    assert row["due"] == "09:00"


def test_a_cron_rule_fires_once_on_the_night_a_local_clock_goes_back() -> None:
    new_york = zoneinfo.ZoneInfo("America/New_York")
    rule = schedules.Rule(cron="30 1 * * *")
    first = rule.after(datetime.datetime(2026, 11, 1, 0, 0, tzinfo=new_york))  # 04:00 UTC
    assert first == datetime.datetime(2026, 11, 1, 1, 30, tzinfo=datetime.UTC) + datetime.timedelta(days=1)
    assert rule.after(first) == first + datetime.timedelta(days=1)


async def test_an_archived_conversation_ends_its_schedules_and_takes_no_new_one(db: Database, scope: Scope) -> None:
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60), "tick")
        await trees.archive_root(conn, scope, tree.root_id)
    [ended] = await fetch_all(db, "SELECT deleted_at FROM schedules WHERE schedule_id = %s", (made["schedule_id"],))
    assert ended["deleted_at"] is not None

    before = await count_rows(db)
    with pytest.raises(Conflict, match="archived"):
        async with db.tx() as conn:
            await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60), "tick")
    assert await count_rows(db) == before


@pytest.mark.parametrize(("catch_up", "expected"), [("once", 1), ("skip", 0)])
async def test_a_per_minute_cron_down_for_days_catches_up_at_its_latest_due_time(
        db: Database, scope: Scope, catch_up: str, expected: int) -> None:
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(cron="* * * * *"),
                                               "tick", catch_up)
    await _due_in_the_past(db, made["schedule_id"], 3 * 86400)
    async with db.tx() as conn:  # the due time on a whole minute, as the rule gives them
        await conn.execute("UPDATE schedules SET next_due_at = date_trunc('minute', next_due_at) "
                           "WHERE schedule_id = %s", (made["schedule_id"],))

    fired = await _fire_all(db, made["schedule_id"])

    async with db.tx() as conn:
        [listed] = await schedules.list_schedules(conn, scope, tree.root_id)
        now = (await (await conn.execute("SELECT now() AS now")).fetchone() or {})["now"]
    assert len(fired) == expected and len(await _inputs_of(db, tree.root_id)) == expected
    if fired:
        assert now - datetime.timedelta(minutes=1) < fired[0]["due_at"] <= now
    assert now < listed["next_due_at"] <= now + datetime.timedelta(minutes=1)


async def test_the_due_list_takes_each_scope_in_turn(db: Database, scope: Scope) -> None:
    """A scope with many schedules due does not fill a sweep's batch ahead of another scope's one:
    each scope's first due schedule comes before any scope's second, oldest first within a place."""
    other = Scope(f"other-{scope.user_id}", scope.app_id)
    busy, quiet = await make_tree(db, scope), await make_tree(db, other)
    async with db.tx() as conn:
        many = [(await schedules.create_schedule(conn, scope, busy.root_id, schedules.Rule(interval_seconds=60),
                                                 f"busy {index}"))["schedule_id"] for index in range(3)]
        one = (await schedules.create_schedule(conn, other, quiet.root_id, schedules.Rule(interval_seconds=60),
                                               "quiet"))["schedule_id"]
    for seconds_ago, schedule_id in zip([40, 30, 20, 10], [*many, one], strict=True):
        await _due_in_the_past(db, schedule_id, seconds_ago)
    async with db.tx() as conn:
        due = [schedule_id for schedule_id in await schedules.due_schedules(conn, limit=10_000)
               if schedule_id in {*many, one}]
    assert due == [many[0], one, many[1], many[2]]


async def test_a_schedule_made_while_its_tree_is_archived_is_refused(db: Database, scope: Scope) -> None:
    """The archive ends a tree's schedules. A schedule made at the same moment read its session
    unarchived (the archive not committed yet) and was added after the archive had ended the others:
    live on an archived tree, refused input at every due time for ever. It waits for the archive now."""
    tree = await make_tree(db, scope)
    archived, release = asyncio.Event(), asyncio.Event()

    async def archive() -> None:
        async with db.tx() as conn:
            await trees.archive_root(conn, scope, tree.root_id)
            archived.set()
            await release.wait()  # holds the archive open while the schedule is made

    async def make() -> None:
        async with db.tx() as conn:
            await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60), "tick")

    archiving = asyncio.create_task(archive())
    await archived.wait()
    making = asyncio.create_task(make())
    await asyncio.sleep(1.0)  # the schedule's transaction reads the session meanwhile
    release.set()
    await archiving
    with pytest.raises(Conflict, match="archived"):
        await making
    assert await scalar(db, "SELECT count(*) FROM schedules WHERE session_id = %s AND deleted_at IS NULL",
                        (tree.root_id,)) == 0


async def test_a_schedule_left_live_on_an_archived_tree_ends_at_its_due_time(db: Database, scope: Scope) -> None:
    """One made before archives waited for it (or brought back by hand) ends when it comes due,
    instead of recording a refused input at every due time for ever."""
    tree = await make_tree(db, scope)
    async with db.tx() as conn:
        made = await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(interval_seconds=60), "tick")
        await trees.archive_root(conn, scope, tree.root_id)
        await conn.execute("UPDATE schedules SET deleted_at = NULL WHERE schedule_id = %s", (made["schedule_id"],))
    await _due_in_the_past(db, made["schedule_id"], 5)
    assert await _fire_all(db, made["schedule_id"]) == []
    [ended] = await fetch_all(db, "SELECT deleted_at FROM schedules WHERE schedule_id = %s", (made["schedule_id"],))
    assert ended["deleted_at"] is not None
    assert await scalar(db, "SELECT count(*) FROM schedule_firings WHERE schedule_id = %s",
                        (made["schedule_id"],)) == 0


def test_names_of_months_and_days_are_no_random_field() -> None:
    for cron in ("0 0 * * FRI", "0 0 * MAR,APR *", "0 0 * * fri-sun"):
        schedules.Rule(cron=cron).check()


async def _firings(conn: Any, scope: Scope, schedule: Row, count: int, *, with_inputs: bool, status: str) -> None:
    """``count`` firings of the schedule, a second apart before now: each with an input of ``status``,
    or each refused (no input)."""
    await conn.execute(
        """WITH due AS (SELECT n, gen_random_uuid() AS input_id FROM generate_series(1, %(count)s) n),
                made AS (INSERT INTO inputs (input_id, session_id, user_id, app_id, text, status, origin)
                         SELECT input_id, %(session_id)s, %(user_id)s, %(app_id)s, 'tick', %(status)s, '{}'
                         FROM due WHERE %(with_inputs)s)
           INSERT INTO schedule_firings (schedule_id, due_at, input_id, error)
           SELECT %(schedule_id)s, now() - make_interval(secs => n), CASE WHEN %(with_inputs)s THEN input_id END,
                  CASE WHEN NOT %(with_inputs)s THEN 'refused' END
           FROM due""",
        {"count": count, "session_id": schedule["session_id"], "user_id": scope.user_id, "app_id": scope.app_id,
         "status": status, "with_inputs": with_inputs, "schedule_id": schedule["schedule_id"]})


async def test_counting_a_schedules_waiting_inputs_reads_none_of_its_refused_firings(
        db: Database, scope: Scope) -> None:
    """At each firing the schedule's latest inputs are counted (canopy_schedule_inputs_waiting):
    along the index of the firings that gave one, not along all its firings, whose refused ones
    (no input: a busy schedule refused for a full queue, minute after minute) it would read and
    skip (143 buffers here, against 12). With the statistics of a database where firings give
    inputs, taken before the refusals piled up (which leaves the two indexes near in cost)."""
    made = [await make_tree(db, scope) for _ in range(2)]
    async with db.tx() as conn:
        busy, refused = [await schedules.create_schedule(conn, scope, tree.root_id, schedules.Rule(cron="* * * * *"),
                                                         "tick", catch_up="all") for tree in made]
        await _firings(conn, scope, busy, 20_000, with_inputs=True, status="consumed")
        await conn.execute("ANALYZE schedule_firings")
        await _firings(conn, scope, refused, 5_000, with_inputs=False, status="pending")
        await conn.execute("UPDATE schedule_firings SET due_at = due_at - interval '1 day' "
                           "WHERE schedule_id = %s", (refused["schedule_id"],))
        await _firings(conn, scope, refused, 3, with_inputs=True, status="pending")
    async with db.tx() as conn:
        read = []
        for _ in range(2):  # the first call of a connection also reads the catalog to plan the function
            explained = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT "
                                           "canopy_schedule_inputs_waiting(%s, %s)",
                                           (refused["schedule_id"], schedules.ALL_WAITING))
            plan = (await explained.fetchone())["QUERY PLAN"][0]["Plan"]
            read.append(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
    waiting = await scalar(db, "SELECT canopy_schedule_inputs_waiting(%s, %s)",
                           (refused["schedule_id"], schedules.ALL_WAITING))
    assert waiting == 3
    assert read[-1] <= 20, read
