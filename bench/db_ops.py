"""Latency of the hot database operations, each as one committed transaction.

    python bench/db_ops.py [--iterations 300] [--members 1000]

Uses ``CANOPY_DATABASE_URL`` when set (a fresh database is created in that server and
dropped afterwards), else an embedded PostgreSQL in a temporary directory. Prints mean
and p99 milliseconds for:

- ``submit_input``  an input to an idle session (input, Turn, pending Run, events)
- ``claim``         ``grant_slots`` + ``acquire_run`` (a slot under the tree lock, then the lease)
- ``complete``      ``finish_turn`` (fence, end the Run, terminal Turn, event)
- ``tree_summary``  the summary of a tree of ``--members`` sessions (two statements)
- ``tree_attention`` the member counts per state of a sidebar page of 50 roots (the web UI reads it
  every 5 s, and after a change in an open tree): the tree of ``--members`` sessions and 49 of 3
- ``wait check``    deadlock detection for a new wait (persistence/deadlocks.py) in a scope where
  ``--members`` - 1 Turns wait in one chain (each for the next one's input): the worst case
  the check walks, rolled back after each measurement; and 198 waits of up to 100 inputs each
  (member i waits for inputs to members i + 1 .. i + 100: each wait is reached by many)
- ``timeline``      a tree of 500 members that each ran ``--timeline-turns`` Turns: its first page
  of 5,000 items, and the "what changed since" read the web UI repeats while the tree runs (one
  member busy, everything else ended an hour ago or more; read once the history is vacuumed and
  analysed, as autovacuum keeps one written over hours)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from persistence import deadlocks, projects, runs, sessions, timeline, trees, turns, views, waits
from persistence.databases import create_database, drop_database
from persistence.db import Database
from persistence.embedded import embedded_url, stop_embedded
from persistence.records import Row, RunRef, Scope
from persistence.settings import Settings

LEASE_SECONDS = 30.0
HUMAN = {"kind": "human"}
AGENT_CONFIG = {"agent_id": None, "model": "canopy/scripted", "instructions": "", "tools": [],
                "approval_mode": "auto"}


@asynccontextmanager
async def bench_database() -> AsyncIterator[str]:
    """A fresh database with the schema: in the configured server, or an embedded one."""
    configured = Settings().database_url
    external = configured.get_secret_value() if configured else None
    with tempfile.TemporaryDirectory(prefix="canopy-bench-") as data_dir:
        url = create_database(external or embedded_url(Path(data_dir)), "canopy_bench")
        try:
            yield url
        finally:
            drop_database(url)
            if not external:
                stop_embedded(Path(data_dir))


async def timed(samples: list[float], operation: Callable[[], Awaitable[object]]) -> object:
    start = time.perf_counter()
    result = await operation()
    samples.append((time.perf_counter() - start) * 1000)
    return result


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def print_results(results: dict[str, list[float]]) -> None:
    """One line per operation: how many samples, their mean and p99 in milliseconds."""
    width = max(len(name) for name in results)
    print(f"{'operation':<{width}}  {'n':>5}  {'mean ms':>8}  {'p99 ms':>8}")
    for name, samples in results.items():
        print(f"{name:<{width}}  {len(samples):>5}  {statistics.fmean(samples):>8.2f}  {p99(samples):>8.2f}")


async def bench_turn_cycle(db: Database, scope: Scope, project_id: uuid.UUID, n: int) -> dict[str, list[float]]:
    """n independent roots, each: submit an input, claim its Run, complete its Turn."""
    async with db.tx() as conn:
        roots = [await sessions.create_root(conn, scope, project_id=project_id, agent_id=None,
                                            agent_config=AGENT_CONFIG, slot_limit=4) for _ in range(n)]
    results: dict[str, list[float]] = {"submit_input": [], "claim": [], "complete": []}

    for root in roots:
        async def submit(root: uuid.UUID = root) -> object:
            async with db.tx() as conn:
                return await turns.submit_input(conn, scope, root, "benchmark task", HUMAN)
        await timed(results["submit_input"], submit)

    held: list[RunRef] = []
    for root in roots:
        async def claim(root: uuid.UUID = root) -> RunRef | None:
            async with db.tx() as conn:
                granted = await runs.grant_slots(conn, root, LEASE_SECONDS)
                return await runs.acquire_run(conn, granted[0]["run_id"], "bench-owner", LEASE_SECONDS)
        run = await timed(results["claim"], claim)
        assert isinstance(run, RunRef)
        held.append(run)

    for run in held:
        async def complete(run: RunRef = run) -> object:
            async with db.tx() as conn:
                return await turns.finish_turn(conn, run, "completed", output="benchmark output")
        await timed(results["complete"], complete)
    return results


async def build_tree(db: Database, scope: Scope, project_id: uuid.UUID, members: int) -> uuid.UUID:
    """A root, ~sqrt(members) children and the rest as grandchildren; a third of them busy."""
    children = max(1, round(math.sqrt(members)))
    async with db.tx() as conn:
        root_id = await sessions.create_root(conn, scope, project_id=project_id, agent_id=None,
                                             agent_config=AGENT_CONFIG, slot_limit=4)
        receipt = await turns.submit_input(conn, scope, root_id, "plan", HUMAN)
        cur = await conn.execute("SELECT run_id FROM runs WHERE turn_id = %s", (receipt["turn_id"],))
        creator = (await cur.fetchone() or {})["run_id"]
        root = await sessions.get_session_row(conn, scope, root_id)
        parents, made = [], [root_id]
        for i in range(members - 1):
            parent = root if i < children else parents[i % len(parents)]
            child = await sessions.create_child(conn, parent, name=f"m{i}", agent_id=None, agent_config=AGENT_CONFIG,
                                                max_depth=2, max_members=10_000, created_by_run_id=creator)
            if i < children:
                parents.append(await sessions.get_session_row(conn, scope, child["session_id"]))
            made.append(child["session_id"])
        for i, session_id in enumerate(made[1:]):
            if i % 3 == 0:
                await turns.submit_input(conn, scope, session_id, "work", HUMAN)
    return root_id


async def read_timed(db: Database, n: int, read: Callable[[Any], Awaitable[Any]]) -> tuple[list[float], Any]:
    """``read(conn)`` in a transaction of its own, ``n`` times: the samples and the last result."""
    samples: list[float] = []
    result = None
    for _ in range(n):
        async def once() -> object:
            async with db.tx() as conn:
                return await read(conn)
        result = await timed(samples, once)
    return samples, result


async def bench_summary(db: Database, scope: Scope, tree_id: uuid.UUID, members: int, n: int
                        ) -> dict[str, list[float]]:
    samples, result = await read_timed(db, n, lambda conn: trees.tree_summary(conn, scope, tree_id))
    assert isinstance(result, dict) and len(result["members"]) == members
    return {f"tree_summary ({members})": samples}


async def bench_attention(db: Database, scope: Scope, project_id: uuid.UUID, big_tree: uuid.UUID, members: int,
                          n: int) -> dict[str, list[float]]:
    tree_ids = [big_tree, *[await build_tree(db, scope, project_id, 3) for _ in range(49)]]
    samples, result = await read_timed(db, n, lambda conn: views.tree_attention(conn, scope, tree_ids))
    assert isinstance(result, dict) and result[big_tree]["members"] == members
    return {f"tree_attention (50 roots: {members} + 49 x 3 members)": samples}


async def running_members(db: Database, scope: Scope, project_id: uuid.UUID, members: int
                          ) -> tuple[list[Row], list[RunRef]]:
    """A tree whose every member runs a Turn: their first inputs' receipts and their Runs, root first."""
    async with db.tx() as conn:
        root_id = await sessions.create_root(conn, scope, project_id=project_id, agent_id=None,
                                             agent_config=AGENT_CONFIG, slot_limit=members)
        receipt = await turns.submit_input(conn, scope, root_id, "plan", HUMAN)
        receipts = [receipt]
        cur = await conn.execute("SELECT run_id FROM runs WHERE turn_id = %s", (receipt["turn_id"],))
        creator = (await cur.fetchone() or {})["run_id"]
        root = await sessions.get_session_row(conn, scope, root_id)
        for i in range(members - 1):
            child = await sessions.create_child(conn, root, name=f"w{i}", agent_id=None, agent_config=AGENT_CONFIG,
                                                max_depth=2, max_members=members, created_by_run_id=creator)
            receipts.append(await turns.submit_input(conn, scope, child["session_id"], "work", HUMAN))
        await runs.grant_slots(conn, root_id, LEASE_SECONDS)
    held: list[RunRef] = []
    async with db.tx() as conn:
        for receipt in receipts:
            cur = await conn.execute("SELECT run_id FROM runs WHERE turn_id = %s", (receipt["turn_id"],))
            run_id = (await cur.fetchone() or {})["run_id"]
            run = await runs.acquire_run(conn, run_id, f"bench-{uuid.uuid4().hex[:6]}", 3600)
            assert run is not None
            held.append(run)
    return receipts, held


def wait_checks(db: Database, root: RunRef, n: int) -> Callable[[uuid.UUID], Awaitable[list[float]]]:
    """Timed deadlock checks of the root's Turn waiting for one input, each rolled back."""
    async def check(input_id: uuid.UUID) -> list[float]:
        samples: list[float] = []
        for _ in range(n):
            async def once() -> None:
                async with db.pool.connection() as conn, conn.transaction(force_rollback=True):
                    await deadlocks.check_wait(conn, root, "/root", input_ids=[input_id])
            await timed(samples, once)
        return samples
    return check


async def bench_wait_check(db: Database, scope: Scope, project_id: uuid.UUID, members: int, n: int
                           ) -> dict[str, list[float]]:
    """Every member runs a Turn, and all but the last wait, each for the next one's input."""
    receipts, held = await running_members(db, scope, project_id, members)
    async with db.tx() as conn:  # member i waits for member i + 1's input; the root waits for nobody yet
        for position, run in enumerate(held[1:-1], start=1):
            await waits.park(conn, run, tool_call_id="w", kind="inputs", timeout_seconds=3600, targets=[],
                             condition={"input_ids": [str(receipts[position + 1]["input_id"])]})
    check = wait_checks(db, held[0], n)
    # The last member runs and waits for nobody: the other waits are beside its chain, not in it.
    return {f"wait check, along a chain of {members - 2} waits": await check(receipts[1]["input_id"]),
            f"wait check, beside {members - 2} waits": await check(receipts[-1]["input_id"])}


async def bench_wait_fan_in(db: Database, scope: Scope, project_id: uuid.UUID, members: int, fan: int, n: int
                            ) -> dict[str, list[float]]:
    """Every member runs a Turn, and member i waits for an input to each of members i + 1 .. i + fan
    (queued behind their Turns): each wait is reached by up to ``fan`` others."""
    receipts, held = await running_members(db, scope, project_id, members)
    async with db.tx() as conn:
        for position, run in enumerate(held[1:-1], start=1):
            later = range(position + 1, min(members, position + 1 + fan))
            queued = [await turns.submit_input(conn, scope, held[j].session_id, "more", HUMAN) for j in later]
            await waits.park(conn, run, tool_call_id="w", kind="inputs", timeout_seconds=3600, targets=[],
                             condition={"input_ids": [str(receipt["input_id"]) for receipt in queued]})
    waiting = members - 2
    return {f"wait check, {waiting} waits of up to {fan} inputs each":
            await wait_checks(db, held[0], n)(receipts[1]["input_id"])}


async def bench_timeline(db: Database, url: str, scope: Scope, turns_per_member: int, n: int
                         ) -> dict[str, list[float]]:
    from tests.persistence.helpers import age_members, seed_worked_tree  # the suite's: the same tree it reads

    tree = await seed_worked_tree(db, scope, members=500, turns_per_member=turns_per_member)
    await age_members(db, tree.tree_id, minutes_each=60)  # what a poll finds: everything ended hours ago
    async with db.tx() as conn:  # and one Turn just began
        await turns.submit_input(conn, scope, tree.root_id, "one more", HUMAN)
    # A history written over hours, not rewritten at once as the aging above did: autovacuum would have
    # cleaned it up and kept its statistics (a poll then reads with the planner's estimates right).
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE")
    since = dt.datetime.now(dt.UTC)

    async def read(samples: list[float], **arguments: object) -> None:
        for _ in range(n):
            async def once() -> object:
                async with db.tx() as conn:
                    return await timeline.timeline(conn, scope, tree.tree_id, **arguments)  # type: ignore[arg-type]
            await timed(samples, once)

    first: list[float] = []
    changed: list[float] = []
    await read(first, limit=5000)
    await read(changed, since=since)
    items = turns_per_member * 500
    return {f"timeline first page (~{items * 4:,} items)": first, "timeline since a moment ago": changed}


async def main(iterations: int, members: int, summary_iterations: int, timeline_turns: int) -> int:
    started = time.perf_counter()
    async with bench_database() as url:
        db = await Database.connect(url, max_size=2)
        try:
            scope = Scope("bench-user", "bench-app")
            async with db.tx() as conn:
                project = await projects.create_project(conn, scope, "bench", Path(tempfile.gettempdir()))
            results = await bench_turn_cycle(db, scope, project["project_id"], iterations)
            big_tree = await build_tree(db, scope, project["project_id"], members)
            results |= await bench_summary(db, scope, big_tree, members, summary_iterations)
            results |= await bench_attention(db, scope, project["project_id"], big_tree, members, summary_iterations)
            results |= await bench_wait_check(db, scope, project["project_id"], members, summary_iterations)
            results |= await bench_wait_fan_in(db, scope, project["project_id"], 200, 100,
                                               max(1, summary_iterations // 10))
            results |= await bench_timeline(db, url, scope, timeline_turns, max(1, summary_iterations // 10))
        finally:
            await db.close()
    print_results(results)
    print(f"total {time.perf_counter() - started:.1f} s (database: "
          f"{'CANOPY_DATABASE_URL' if Settings().database_url else 'embedded PostgreSQL'})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300, help="turn cycles (submit, claim, complete)")
    parser.add_argument("--members", type=int, default=1000, help="members of the summarised tree")
    parser.add_argument("--summary-iterations", type=int, default=300)
    parser.add_argument("--timeline-turns", type=int, default=8, help="Turns per member of the timeline's tree")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.iterations, args.members, args.summary_iterations, args.timeline_turns)))
