"""What usage accounting costs: the rollup in a tree summary, and the tree's usage row on the hot path.

    python bench/usage.py [--members 1000] [--iterations 200] [--steps 150] [--rounds 4] [--think-ms 0 200]

Uses ``CANOPY_DATABASE_URL`` when set (a fresh database is created in that server and dropped
afterwards), else an embedded PostgreSQL in a temporary directory. Prints mean and p99 ms of:

- ``tree_summary``       the whole summary of a tree of ``--members`` sessions, each with two
                         charged Runs (its two statements: the head with the rollup, the members)
- ``head with rollup``   the head statement alone: state, budget, the tree's usage row, every
                         member's usage summed from its Runs, the spawned trees', the budget check
- ``members``            the members statement alone (what the summary cost before the rollup)
- ``budget check``       ``canopy_budget_reached`` for a tree with a budget (every model boundary
                         runs it inside its one statement)

and, for the usage row every reply updates (``append_reply.sql``), a model step's transaction
(the reply, its tool result, the next boundary) by 4 concurrent writers, all in one tree (they
share its usage row: a hot row) and each in a tree of its own, ``--rounds`` rounds of each in
alternation, ``--steps`` steps per writer and round, back to back (0 ms: the worst case) and with
a model latency between steps (``--think-ms``, default 0 and 200).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.db_ops import AGENT_CONFIG, HUMAN, LEASE_SECONDS, bench_database, print_results, timed
from persistence import messages, projects, runs, sessions, trees, turns, usage
from persistence.db import Connection, Database
from persistence.records import RunRef, Scope

WRITERS = 4
_CALL = {"id": "c", "name": "list_agents", "arguments": {}}


async def _claim(conn: Connection, tree_id: uuid.UUID, session_id: uuid.UUID) -> RunRef:
    granted = await runs.grant_slots(conn, tree_id, LEASE_SECONDS)
    run_id = next(row["run_id"] for row in granted if row["session_id"] == session_id)
    run = await runs.acquire_run(conn, run_id, f"bench-{uuid.uuid4().hex[:8]}", LEASE_SECONDS)
    assert run is not None
    return run


async def _charged_turn(conn: Connection, scope: Scope, tree_id: uuid.UUID, session_id: uuid.UUID) -> None:
    """One Turn of the session with a charged reply, its tool result and its answer."""
    await turns.submit_input(conn, scope, session_id, "work", HUMAN)
    run = await _claim(conn, tree_id, session_id)
    await messages.append_reply(conn, run, content=None, tool_calls=[_CALL],
                                usage={"prompt_tokens": 1200, "completion_tokens": 40}, cost_usd=0.0012)
    await messages.append_tool_results(conn, run, [("c", '{"agents": []}')])
    await messages.append_reply(conn, run, content="done", tool_calls=None,
                                usage={"prompt_tokens": 1300, "completion_tokens": 20}, cost_usd=0.0013)
    await turns.finish_turn(conn, run, "completed", output="done")


async def build_charged_tree(db: Database, scope: Scope, project_id: uuid.UUID, members: int) -> uuid.UUID:
    """A root and members - 1 children (the root's 32 children, the rest their children), each member
    with two Turns of two charged replies (two Runs each). One transaction per member."""
    async with db.tx() as conn:
        root_id = await sessions.create_root(conn, scope, project_id=project_id, agent_id=None,
                                             agent_config=AGENT_CONFIG, slot_limit=4, budget={"max_tokens": 10**12})
        root = await sessions.get_session_row(conn, scope, root_id)
        made, parents = [root_id], []
        for i in range(members - 1):
            parent = root if i < 32 else parents[i % len(parents)]
            child = await sessions.create_child(conn, parent, name=f"m{i}", agent_id=None, agent_config=AGENT_CONFIG,
                                                max_depth=2, max_members=100_000, created_by_run_id=uuid.uuid4())
            if i < 32:
                parents.append(await sessions.get_session_row(conn, scope, child["session_id"]))
            made.append(child["session_id"])
    for session_id in made:
        async with db.tx() as conn:
            for _ in range(2):
                await _charged_turn(conn, scope, root_id, session_id)
    return root_id


async def bench_reads(db: Database, scope: Scope, project_id: uuid.UUID, members: int, n: int
                      ) -> dict[str, list[float]]:
    tree_id = await build_charged_tree(db, scope, project_id, members)
    results: dict[str, list[float]] = {f"tree_summary ({members})": [], "head with rollup": [], "members": [],
                                       "budget check": []}
    for _ in range(n):
        async def whole() -> object:
            async with db.tx() as conn:
                return await trees.tree_summary(conn, scope, tree_id)

        async def head() -> object:
            async with db.tx() as conn:
                return await usage.tree_head(conn, scope, tree_id)

        async def members_only() -> object:
            async with db.tx() as conn:
                return await sessions.tree_members(conn, scope, tree_id)

        async def check() -> object:
            async with db.tx() as conn:
                return await usage.budget_reached(conn, tree_id)

        summary = await timed(results[f"tree_summary ({members})"], whole)
        assert isinstance(summary, dict) and summary["usage"]["model_calls"] == members * 4
        await timed(results["head with rollup"], head)
        await timed(results["members"], members_only)
        assert await timed(results["budget check"], check) is None
    return results


async def _writer(db: Database, run: RunRef, steps: int, think_ms: float, samples: list[float]) -> None:
    """``steps`` model steps of one Run, each its reply, its tool result and the next boundary, and
    ``think_ms`` between them (the model call's latency)."""
    for step in range(steps):
        await asyncio.sleep(think_ms / 1000)
        async def one(step: int = step) -> None:
            call = {**_CALL, "id": f"c{step}"}
            async with db.tx() as conn:
                await messages.append_reply(conn, run, content=None, tool_calls=[call],
                                            usage={"prompt_tokens": 1000, "completion_tokens": 30}, cost_usd=0.001)
                await messages.append_tool_results(conn, run, [(call["id"], '{"agents": []}')])
                await messages.take_boundary(conn, run)
        await timed(samples, one)


async def _writers(db: Database, scope: Scope, project_id: uuid.UUID, trees_used: int) -> list[RunRef]:
    """WRITERS executing Runs: the root and children of one tree, or the roots of WRITERS trees."""
    async with db.tx() as conn:
        tree_ids = [await sessions.create_root(conn, scope, project_id=project_id, agent_id=None,
                                               agent_config=AGENT_CONFIG, slot_limit=WRITERS)
                    for _ in range(trees_used)]
        held = []
        for i in range(WRITERS):
            tree_id = tree_ids[i % trees_used]
            session_id = tree_id
            if trees_used == 1 and i:
                root = await sessions.get_session_row(conn, scope, tree_id)
                child = await sessions.create_child(conn, root, name=f"w{i}", agent_id=None, agent_config=AGENT_CONFIG,
                                                    max_depth=2, max_members=10, created_by_run_id=uuid.uuid4())
                session_id = child["session_id"]
            await turns.submit_input(conn, scope, session_id, "work", HUMAN)
            held.append(await _claim(conn, tree_id, session_id))
    return held


async def bench_hot_row(db: Database, scope: Scope, project_id: uuid.UUID, steps: int, rounds: int,
                        think_ms: float) -> dict[str, list[float]]:
    """The two shapes in alternation (``rounds`` each), so that a drift of the machine's speed
    weighs on both alike; the label carries the commits per second over all rounds."""
    shapes = {"4 writers, one tree": 1, "4 writers, 4 trees": WRITERS}
    samples: dict[str, list[float]] = {shape: [] for shape in shapes}
    seconds = dict.fromkeys(shapes, 0.0)
    for _ in range(rounds):
        for shape, trees_used in shapes.items():
            held = await _writers(db, scope, project_id, trees_used)
            started = time.perf_counter()
            await asyncio.gather(*(_writer(db, run, steps, think_ms, samples[shape]) for run in held))
            seconds[shape] += time.perf_counter() - started
    return {f"step tx, {shape}, {think_ms:g} ms apart ({len(samples[shape]) / seconds[shape]:,.0f}/s)": samples[shape]
            for shape in shapes}


async def main(members: int, iterations: int, steps: int, rounds: int, think_ms: list[float]) -> int:
    started = time.perf_counter()
    async with bench_database() as url:
        db = await Database.connect(url, max_size=WRITERS + 1)
        try:
            scope = Scope("bench-user", "bench-app")
            async with db.tx() as conn:
                project = await projects.create_project(conn, scope, "bench", Path(tempfile.gettempdir()))
            results = await bench_reads(db, scope, project["project_id"], members, iterations)
            for think in think_ms:
                results |= await bench_hot_row(db, scope, project["project_id"], steps, rounds, think)
        finally:
            await db.close()
    print_results(results)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000, help="members of the summarised tree")
    parser.add_argument("--iterations", type=int, default=200, help="reads of each kind")
    parser.add_argument("--steps", type=int, default=150, help="model steps per writer and round (hot-row test)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each shape, in alternation (hot-row test)")
    parser.add_argument("--think-ms", type=float, nargs="+", default=[0, 200],
                        help="model latency between a writer's steps (hot-row test; one run per value)")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.members, args.iterations, args.steps, args.rounds, args.think_ms)))
