"""Lease renewals (actors/heartbeats.py) read back from the database: one beat renews every Run a
process holds and stops those it must; and a Run's lease is renewed while its process's other work
cannot get a connection."""

from __future__ import annotations

import asyncio

import pytest
import ray

from actors.heartbeats import Heartbeats
from actors.naming import NAMESPACE, host_actor_name
from actors.runtime import Runtime
from actors.scripted import say, script
from persistence import runs
from persistence.db import Database
from persistence.records import RunRef, Scope
from persistence.runs import LEASE_EXPIRED
from persistence.settings import Settings
from tests.actors.helpers import a_root_in_host, eventually, rows
from tests.persistence.helpers import child_run, expire_lease, run_row, start_root_run


def beats_of(db: Database) -> Heartbeats:
    async def database() -> Database:
        return db

    return Heartbeats(database, Settings(lease_seconds=600, heartbeat_seconds=60))


async def test_a_beat_renews_the_runs_held_and_stops_once_those_lost_or_being_cancelled(db: Database,
                                                                                     scope: Scope) -> None:
    _, root = await start_root_run(db, scope)
    _, lost = await child_run(db, root, "lost")
    _, cancelled = await child_run(db, root, "cancelled")
    async with db.tx() as conn:
        await expire_lease(conn, lost.run_id)
        await conn.execute("UPDATE turns SET status = 'cancelling' WHERE turn_id = %s", (cancelled.turn_id,))
    before = (await run_row(db, root.run_id))["lease_expires_at"]
    stopped: list[str] = []
    beats = beats_of(db)
    for name, run in (("root", root), ("lost", lost), ("cancelled", cancelled)):
        beats.hold(run, lambda name=name: stopped.append(name))  # type: ignore[misc]
    try:
        await beats.beat()
        assert sorted(stopped) == ["cancelled", "lost"]
        assert (await run_row(db, root.run_id))["lease_expires_at"] > before
        await beats.beat()
        assert sorted(stopped) == ["cancelled", "lost"]  # once each; root still held
    finally:
        beats.close()


async def _waiting_on_a_lock(db: Database) -> bool:
    found = await rows(db, "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database()")
    return bool(found[0]["n"])


async def test_a_run_held_again_during_a_beat_is_judged_by_the_next_beat_not_that_one(db: Database,
                                                                                     scope: Scope) -> None:
    """A beat's answer is about the executions it asked about: the same Run handed back and taken up
    again meanwhile (by the same incarnation) is not stopped by it."""
    _, run = await start_root_run(db, scope)
    stopped: list[str] = []
    beats = beats_of(db)
    beats.hold(run, lambda: stopped.append("first"))
    try:
        async with db.tx() as conn:
            await runs.hand_back(conn, run, 600)  # unowned now: not held by anybody
        async with db.tx() as locker:
            await locker.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            beat = asyncio.create_task(beats.beat())
            await eventually(lambda: _waiting_on_a_lock(db))
            beats.release(run)
            again = RunRef(run.scope, run.session_id, run.tree_id, run.turn_id, run.run_id, run.owner)
            beats.hold(again, lambda: stopped.append("again"))
        await beat
        assert stopped == []  # the first execution ended; the one held again is not the beat's
        await beats.beat()
        assert stopped == ["again"]  # the Run is not held: the next beat says so
    finally:
        beats.close()


@pytest.mark.default_shape  # a host's pool is what its sessions share; a dedicated session's is its own
async def test_a_run_keeps_its_lease_while_every_connection_of_its_host_waits_on_a_lock(
        runtime: Runtime, scope: Scope) -> None:
    """A Run's renewals went through the pool its host's sessions work with. Transactions waiting on
    a lock (each up to the lock timeout, 30 s) took every connection of the pool, the renewals waited
    behind them, and the healthy Run's lease ran out: it was recovered as dead, its model step lost.
    Here the host's pool is taken whole by replies waiting to be written (the test holds a lock on
    the history) while a Run of the same host is in a model step three leases long."""
    settings = runtime.settings
    lease = settings.lease_seconds
    victim = await a_root_in_host(runtime, scope, 0, script(say("still alive", delay_ms=int(3 * lease * 1000))))
    victim_id = victim["session"]["session_id"]
    await eventually(lambda: rows(runtime.db, "SELECT 1 FROM model_calls c JOIN runs r USING (run_id) "
                                  "WHERE r.session_id = %s", victim_id))  # its model step has begun
    host_pid = await ray.get_actor(host_actor_name(0), namespace=NAMESPACE).ready.remote()
    pool = max(4, 2 * settings.db_pool_max)  # a host's (actors/hosting.py)
    # More replies than the host has connections, each due while the lock is held.
    blockers = [await a_root_in_host(runtime, scope, 0, script(say(f"blocked {i}", delay_ms=5000)))
                for i in range(pool + 1)]
    async with runtime.db.tx() as locker:
        await locker.execute("LOCK TABLE thread_messages IN SHARE MODE")  # reads go on, inserts wait

        async def host_waiting() -> bool:
            waiting = await rows(runtime.db, "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = "
                                 "'Lock' AND application_name = %s", f"canopy-{host_pid}")
            return waiting[0]["n"] >= pool

        await eventually(host_waiting, timeout=30)
        await asyncio.sleep(2 * lease)  # every lease has run out twice, unless renewed
    results = [await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
               for created in (victim, *blockers)]
    assert [result["status"] for result in results] == ["completed"] * (pool + 2), results
    assert results[0]["output"] == "still alive"
    victim_runs = await rows(runtime.db, "SELECT status, error FROM runs WHERE session_id = %s", victim_id)
    assert victim_runs == [{"status": "completed", "error": None}], victim_runs  # one Run, never recovered
    expired = await rows(runtime.db, "SELECT count(*) AS n FROM runs r JOIN sessions s USING (session_id) "
                         "WHERE s.user_id = %s AND s.app_id = %s AND r.error = %s",
                         scope.user_id, scope.app_id, LEASE_EXPIRED)
    assert expired[0]["n"] == 0
