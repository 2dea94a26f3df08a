"""Runs: slot grants under the per-tree lock, leases, fencing and recovery of dead owners.

A Run holds one of its tree's slots exactly while its status is ``running``; the slot
is released by the same statement that moves it out of ``running``. ``pending`` Runs
are the tree's FIFO queue (ordered by ``queued_at``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Collection

import psycopg

from persistence import lifecycle, metrics
from persistence.db import Connection, milliseconds, query, savepoint
from persistence.errors import LeaseLost
from persistence.events import append_event
from persistence.records import Row, RunRef, Scope, new_id
from persistence.sessions import SESSION_COLUMNS, TURN_INPUT_COLUMNS, TurnInput, pop_turn_input
from persistence.statuses import RunKind

# A turn whose runs keep dying before they get anywhere is failed instead of resumed forever.
MAX_RECOVERIES_PER_TURN = 5
LEASE_EXPIRED = "lease expired: the run's owner stopped heart-beating"

_LOCK_TREE = "SELECT user_id, app_id, slot_limit, stopped FROM trees WHERE tree_id = %s FOR NO KEY UPDATE"
# The free slots are counted in the same statement, under the tree lock the caller holds. The
# tree's first grant starts the wall time of its budget (tree_usage.first_run_at); later grants
# find it set and change nothing there. UPDATE ... RETURNING yields rows in no particular order:
# re-sort so callers see the FIFO order.
_GRANT = """
WITH granted AS (
    UPDATE runs SET status = 'running', started_at = clock_timestamp(), owner = NULL,
           lease_expires_at = now() + make_interval(secs => %(lease)s)
    WHERE run_id IN (
        SELECT run_id FROM runs WHERE tree_id = %(tree_id)s AND status = 'pending'
        ORDER BY queued_at, run_id
        LIMIT greatest(0, %(slot_limit)s
                          - (SELECT count(*) FROM runs WHERE tree_id = %(tree_id)s AND status = 'running'))
        FOR UPDATE)
    RETURNING run_id, session_id, turn_id, queued_at, started_at
), first_run AS (
    UPDATE tree_usage SET first_run_at = (SELECT min(started_at) FROM granted)
    WHERE tree_id = %(tree_id)s AND first_run_at IS NULL AND EXISTS (SELECT 1 FROM granted))
SELECT run_id, session_id, turn_id, extract(epoch FROM started_at - queued_at)::float8 AS waited_seconds
FROM granted ORDER BY queued_at, run_id
"""
_ACQUIRE = """
UPDATE runs r SET owner = %(owner)s, lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM sessions s
WHERE r.status = 'running' AND r.owner IS NULL AND s.session_id = r.session_id AND r.run_id = %(run_id)s
RETURNING r.run_id, r.turn_id, r.session_id, r.tree_id, r.kind, s.user_id, s.app_id
"""
# The session's oldest claimable Run. If another incarnation takes it first, the UPDATE finds
# it owned and acquires nothing (a session has one claimable Run at a time: one Turn, one Run).
# It also hands back what the Run reads first: its session's row and its Turn's input.
_ACQUIRE_NEXT = f"""
UPDATE runs r SET owner = %(owner)s, lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM sessions s JOIN turns t ON t.session_id = s.session_id
WHERE r.status = 'running' AND r.owner IS NULL AND s.session_id = r.session_id AND t.turn_id = r.turn_id
  AND r.run_id = (
    SELECT run_id FROM runs WHERE session_id = %(session_id)s AND status = 'running' AND owner IS NULL
    ORDER BY started_at LIMIT 1)
RETURNING r.run_id, r.turn_id, r.kind, {SESSION_COLUMNS}, s.user_id, s.app_id, {TURN_INPUT_COLUMNS}
"""
_FENCE = """
SELECT run_id FROM runs
WHERE run_id = %s AND owner = %s AND status = 'running' AND lease_expires_at > now()
FOR NO KEY UPDATE
"""
_EXPIRED = """
SELECT run_id FROM runs WHERE status = 'running' AND lease_expires_at < now() AND run_id <> ALL(%(skip)s)
ORDER BY lease_expires_at LIMIT %(limit)s
"""
_LOCK_EXPIRED_RUN = """
SELECT r.run_id, r.turn_id, r.session_id, r.tree_id, t.status AS turn_status, s.user_id, s.app_id
FROM runs r JOIN turns t ON t.turn_id = r.turn_id JOIN sessions s ON s.session_id = r.session_id
WHERE r.run_id = %s AND r.status = 'running' AND r.lease_expires_at < now()
FOR UPDATE OF r SKIP LOCKED
"""


async def grant_slots(conn: Connection, tree_id: uuid.UUID, lease_seconds: float) -> list[Row]:
    """Move the oldest pending Runs of the tree into free slots; return what was granted.

    Serialised by the tree row lock, and counted from the runs table, so the limit holds
    across supervisor restarts, API replicas and nodes. Each grant is a ``run_started``
    event: watchers see a queued Turn start executing.
    """
    cur = await conn.execute(_LOCK_TREE, (tree_id,))
    tree = await cur.fetchone()
    return await _grant_locked(conn, tree_id, tree, lease_seconds) if tree is not None else []


async def hand_off_slots(conn: Connection, tree_id: uuid.UUID, lease_seconds: float) -> list[Row] | None:
    """``grant_slots`` inside a transaction that freed a slot (a Run's end, a park) or queued a
    Run (a resumed wait), so the next Run starts without a round trip to the supervisor. It
    never waits for the tree's lock: None when another transaction holds it (the caller then
    pokes the supervisor, which grants after that transaction), else what was granted."""
    cur = await conn.execute(_LOCK_TREE + " SKIP LOCKED", (tree_id,))
    tree = await cur.fetchone()
    return await _grant_locked(conn, tree_id, tree, lease_seconds) if tree is not None else None


async def _grant_locked(conn: Connection, tree_id: uuid.UUID, tree: Row, lease_seconds: float) -> list[Row]:
    cur = await conn.execute(_GRANT, {"tree_id": tree_id, "slot_limit": tree["slot_limit"], "lease": lease_seconds})
    granted = await cur.fetchall()
    scope = Scope(tree["user_id"], tree["app_id"])
    for run in granted:
        await append_event(conn, scope, "run_started", session_id=run["session_id"], tree_id=tree_id,
                           turn_id=run["turn_id"], run_id=run["run_id"])
        metrics.observe_at_commit(conn, metrics.SLOT_WAIT, run.pop("waited_seconds"))
    return granted


async def acquire_run(conn: Connection, run_id: uuid.UUID, owner: str, lease_seconds: float) -> RunRef | None:
    """Take the lease of this Run if it holds a granted slot and no owner yet."""
    cur = await conn.execute(_ACQUIRE, {"run_id": run_id, "owner": owner, "lease": lease_seconds})
    row = await cur.fetchone()
    if row is None:
        return None
    run = _run_ref(row, owner)
    _log_started(conn, run)
    return run


@dataclasses.dataclass(frozen=True)
class AcquiredRun:
    """A Run just acquired, with what it reads first: its session's row and its Turn's input."""

    run: RunRef
    session: Row
    turn_input: TurnInput


async def acquire_next_run(conn: Connection, session_id: uuid.UUID, owner: str, lease_seconds: float
                           ) -> AcquiredRun | None:
    """Take the lease of the session's oldest Run that holds a granted slot and no owner yet (one
    statement, which also reads the session and the Turn's input: one round trip less on every
    activation)."""
    cur = await conn.execute(_ACQUIRE_NEXT, {"session_id": session_id, "owner": owner, "lease": lease_seconds})
    row = await cur.fetchone()
    if row is None:
        return None
    run = _run_ref(row, owner)
    _log_started(conn, run)
    turn_input = pop_turn_input(row)
    for key in ("run_id", "turn_id", "kind"):  # the rest is the session's row
        del row[key]
    return AcquiredRun(run, row, turn_input)


def _log_started(conn: Connection, run: RunRef) -> None:
    lifecycle.log_at_commit(conn, "run_started", tree_id=run.tree_id, session_id=run.session_id,
                            turn_id=run.turn_id, run_id=run.run_id, kind=run.kind)


def _run_ref(row: Row, owner: str) -> RunRef:
    return RunRef(
        scope=Scope(row["user_id"], row["app_id"]),
        session_id=row["session_id"],
        tree_id=row["tree_id"],
        turn_id=row["turn_id"],
        run_id=row["run_id"],
        owner=owner,
        kind=row["kind"],
    )


async def heartbeat(conn: Connection, held: Collection[RunRef], lease_seconds: float,
                    busy_wait_seconds: float = 0.5) -> dict[uuid.UUID, str]:
    """Renew the leases of ``held``; the status of the Turn of each Run still held, by run id. A Run
    missing from the answer is no longer held by the incarnation that asked. A Run whose row another
    transaction has locked (its own commit, say) is waited for up to ``busy_wait_seconds`` after the
    others are renewed; past that it counts as held, and is renewed or judged at a later beat: one
    Run's commit waiting on a lock must not hold up the renewal of all the others, nor be cut off
    because its lease ran out meanwhile (its writes are fenced at its commit's start)."""
    cur = await conn.execute(query("run_heartbeats"), {
        "run_ids": [run.run_id for run in held], "owners": [run.owner for run in held], "lease": lease_seconds})
    named = {row["run_id"]: (str(row["turn_status"]), bool(row["renewed"])) for row in await cur.fetchall()}
    busy = [run for run in held if run.run_id in named and not named[run.run_id][1]]
    if busy:
        with contextlib.suppress(psycopg.errors.LockNotAvailable):
            async with savepoint(conn):
                await conn.execute("SELECT set_config('lock_timeout', %s, true)",
                                   (f"{milliseconds(busy_wait_seconds)}ms",))
                await conn.execute(query("run_heartbeats_busy"), {
                    "run_ids": [run.run_id for run in busy], "owners": [run.owner for run in busy],
                    "lease": lease_seconds})
    return {run_id: status for run_id, (status, _) in named.items()}


async def fence(conn: Connection, run: RunRef) -> None:
    """Lock the Run row if this incarnation still holds its lease; otherwise refuse to write."""
    cur = await conn.execute(_FENCE, (run.run_id, run.owner))
    if await cur.fetchone() is None:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")


async def hold_unowned(conn: Connection, session_id: uuid.UUID, wait_seconds: float) -> None:
    """Hold the session's granted, unowned Runs ``wait_seconds`` more (their host drains: see the query)."""
    await conn.execute(query("run_hold_unowned"), {"session_id": session_id, "wait": wait_seconds})


async def hand_back(conn: Connection, run: RunRef, lease_seconds: float) -> None:
    """Give up the Run's lease but not the Run: it stays granted for the session's next incarnation
    (its host moves, actors/hosting.py), which has ``lease_seconds`` to acquire it before the sweep
    recovers it as abandoned. LeaseLost if this incarnation no longer holds it."""
    cur = await conn.execute(query("run_hand_back"), {"run_id": run.run_id, "owner": run.owner,
                                                      "lease": lease_seconds})
    if cur.rowcount != 1:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")
    lifecycle.log_at_commit(conn, "run_handed_back", tree_id=run.tree_id, session_id=run.session_id,
                            turn_id=run.turn_id, run_id=run.run_id, owner=run.owner)


async def end_own_run(conn: Connection, run: RunRef, status: str, *, output: str | None = None,
                      error: str | None = None) -> None:
    """``end_run`` by the Run's own incarnation, fenced in the same statement (else LeaseLost)."""
    cur = await conn.execute(
        """UPDATE runs SET status = %s, output = %s, error = %s, ended_at = clock_timestamp(),
                  lease_expires_at = NULL
           WHERE run_id = %s AND owner = %s AND status = 'running' AND lease_expires_at > now()""",
        (status, output, error, run.run_id, run.owner),
    )
    if cur.rowcount != 1:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")


async def end_run(conn: Connection, run_id: uuid.UUID, status: str, *, output: str | None = None,
                  error: str | None = None) -> None:
    """Move a Run out of pending/running (releasing its slot in the same statement)."""
    await conn.execute(
        """UPDATE runs SET status = %s, output = %s, error = %s, ended_at = clock_timestamp(),
                  lease_expires_at = NULL
           WHERE run_id = %s""",
        (status, output, error, run_id),
    )


async def insert_run(conn: Connection, turn_id: uuid.UUID, session_id: uuid.UUID, tree_id: uuid.UUID,
                     resumes_run_id: uuid.UUID | None = None) -> uuid.UUID:
    run_id = new_id()
    await conn.execute(
        """INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, resumes_run_id)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (run_id, turn_id, session_id, tree_id, RunKind.RESUME if resumes_run_id else RunKind.START,
         resumes_run_id),
    )
    return run_id


async def expired_runs(conn: Connection, skip: list[uuid.UUID], limit: int = 100) -> list[uuid.UUID]:
    """Running Runs whose lease ran out, the longest expired first, but for those in ``skip``
    (being recovered already: a page of them must not hide the rest)."""
    cur = await conn.execute(_EXPIRED, {"skip": skip, "limit": limit})
    return [row["run_id"] for row in await cur.fetchall()]


async def lock_expired_run(conn: Connection, run_id: uuid.UUID) -> Row | None:
    """The expired Run, locked, if it is still expired and nobody else is recovering it."""
    cur = await conn.execute(_LOCK_EXPIRED_RUN, (run_id,))
    return await cur.fetchone()


async def deaths_in_a_row(conn: Connection, turn_id: uuid.UUID) -> int:
    """The Turn's Runs that lost their lease since its last Run that committed a reply."""
    cur = await conn.execute(query("run_deaths_in_a_row"), {"turn_id": turn_id, "lease_expired": LEASE_EXPIRED})
    row = await cur.fetchone()
    return row["n"] if row else 0


async def has_claimable_run(conn: Connection, session_id: uuid.UUID) -> bool:
    """Whether the session holds a granted slot that no actor owns yet (work for its actor)."""
    cur = await conn.execute(
        "SELECT 1 FROM runs WHERE session_id = %s AND status = 'running' AND owner IS NULL LIMIT 1", (session_id,)
    )
    return await cur.fetchone() is not None


async def trees_with_queued_runs(conn: Connection) -> list[uuid.UUID]:
    cur = await conn.execute(query("runs_queued_trees"))
    return [row["tree_id"] for row in await cur.fetchall()]


async def sessions_with_unowned_grants(conn: Connection, older_than_seconds: float) -> list[uuid.UUID]:
    """Sessions holding a Run granted over ``older_than_seconds`` ago that nobody acquired (a lost hint)."""
    cur = await conn.execute(query("runs_unowned_grants"), {"seconds": older_than_seconds})
    return [row["session_id"] for row in await cur.fetchall()]


async def over(conn: Connection, run_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Of ``run_ids``, the Runs that are over (ended, or recovered into another Run)."""
    cur = await conn.execute(query("runs_over"), {"run_ids": list(run_ids)})
    return {row["run_id"] for row in await cur.fetchall()}


async def tree_has_active_runs(conn: Connection, tree_id: uuid.UUID) -> bool:
    """Whether any Run of the tree is queued or holds a slot."""
    cur = await conn.execute(query("tree_active_runs"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return bool(row and row["active"])
