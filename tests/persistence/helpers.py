"""Factories for the persistence tests: every row is made through the repositories.

An executing Run is obtained the real way: an input is submitted (its Turn gets a
``pending`` Run), ``runs.grant_slots`` moves it into a slot, and ``runs.acquire_run``
gives it an owner and a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from persistence import cooperation, messages, projects, runs, sessions, turns, waits
from persistence.db import Connection, Database
from persistence.records import Row, RunRef, Scope

WORKDIR_ROOT = Path(tempfile.gettempdir()) / "canopy-test-workdirs"
LEASE_SECONDS = 30.0
HUMAN: dict[str, Any] = {"kind": "human"}
AGENT_CONFIG: dict[str, Any] = {
    "agent_id": None,
    "model": "canopy/scripted",
    "instructions": "",
    "tools": [],
    "approval_mode": "auto",
}
# Every table a repository writes; ``count_rows`` counts them database-wide.
TABLES = (
    "trees", "sessions", "inputs", "turns", "runs", "thread_messages", "coop_messages", "events", "waits",
    "wait_targets", "tool_receipts", "requests", "schedules", "schedule_firings", "tree_usage",
    "session_usage",
)


@dataclasses.dataclass(frozen=True)
class Tree:
    scope: Scope
    project_id: uuid.UUID
    root_id: uuid.UUID

    @property
    def tree_id(self) -> uuid.UUID:
        return self.root_id


def new_owner() -> str:
    return f"owner-{uuid.uuid4().hex[:8]}"


async def make_tree(db: Database, scope: Scope, *, slot_limit: int = 4, project_id: uuid.UUID | None = None
                    ) -> Tree:
    """A project (unless given) and a new root session with no input yet."""
    async with db.tx() as conn:
        if project_id is None:
            project_id = (await projects.create_project(conn, scope, "test", WORKDIR_ROOT))["project_id"]
        root_id = await sessions.create_root(conn, scope, project_id=project_id, agent_id=None,
                                             agent_config=AGENT_CONFIG, slot_limit=slot_limit, title="root")
    return Tree(scope, project_id, root_id)


async def submit(db: Database, scope: Scope, session_id: uuid.UUID, text: str = "task",
                 origin: dict[str, Any] | None = None) -> Row:
    async with db.tx() as conn:
        return await turns.submit_input(conn, scope, session_id, text, origin or HUMAN)


async def grant(db: Database, tree_id: uuid.UUID) -> list[uuid.UUID]:
    """One ``grant_slots`` transaction: the run ids moved into slots, in grant order."""
    async with db.tx() as conn:
        return [row["run_id"] for row in await runs.grant_slots(conn, tree_id, LEASE_SECONDS)]


async def latest_run_id(db: Database, turn_id: uuid.UUID | str) -> uuid.UUID:
    row = await fetch_one(db, "SELECT run_id FROM runs WHERE turn_id = %s ORDER BY queued_at DESC LIMIT 1",
                          (uuid.UUID(str(turn_id)),))
    return row["run_id"]


async def acquire(db: Database, run_id: uuid.UUID, owner: str | None = None) -> RunRef:
    async with db.tx() as conn:
        run = await runs.acquire_run(conn, run_id, owner or new_owner(), LEASE_SECONDS)
    assert run is not None, f"run {run_id} holds no unowned slot"
    return run


async def claim_turn(db: Database, tree_id: uuid.UUID, turn_id: uuid.UUID | str) -> RunRef:
    """Grant the tree's free slots, then acquire the Turn's latest Run (which must have got one)."""
    await grant(db, tree_id)
    return await acquire(db, await latest_run_id(db, turn_id))


async def start_run(db: Database, scope: Scope, tree_id: uuid.UUID, session_id: uuid.UUID,
                    text: str = "task") -> tuple[Row, RunRef]:
    """Submit an input to an idle session and return its receipt and its executing Run."""
    receipt = await submit(db, scope, session_id, text)
    assert receipt["status"] == "started", receipt
    return receipt, await claim_turn(db, tree_id, receipt["turn_id"])


async def start_root_run(db: Database, scope: Scope, *, slot_limit: int = 4) -> tuple[Tree, RunRef]:
    tree = await make_tree(db, scope, slot_limit=slot_limit)
    _, run = await start_run(db, scope, tree.tree_id, tree.root_id)
    return tree, run


# A dispatcher Turn as tools see it: auto approvals and these tools (persistence knows no tool names).
DISPATCHER = cooperation.Dispatcher("auto", frozenset({"create_session", "submit_input", "send_message"}))


def limits(*, max_depth: int = 2, max_members: int = 1000, max_spawned_trees: int = 8,
           slot_limit: int = 4) -> cooperation.CreateLimits:
    return cooperation.CreateLimits(max_depth=max_depth, max_members=max_members,
                                    max_spawned_trees=max_spawned_trees, slot_limit=slot_limit)


async def create_child(db: Database, run: RunRef, name: str, *, call_id: str | None = None,
                       description: str = "do the child's task", max_depth: int = 2) -> Row:
    """``create_session`` as the Run's tool call, in its own transaction."""
    async with db.tx() as conn:
        return await cooperation.create_session(conn, run, call_id or f"call-{uuid.uuid4().hex[:8]}", name=name,
                                                description=description, limits=limits(max_depth=max_depth),
                                                dispatcher=DISPATCHER)


async def child_run(db: Database, run: RunRef, name: str, *, max_depth: int = 2) -> tuple[Row, RunRef]:
    """A child created by ``run`` and the child's own executing Run."""
    child = await create_child(db, run, name, max_depth=max_depth)
    return child, await claim_turn(db, run.tree_id, child["turn_id"])


async def finish(db: Database, run: RunRef, status: str = "completed", output: str | None = None) -> Row | None:
    async with db.tx() as conn:
        return await turns.finish_turn(conn, run, status, output=output)


async def fetch_one(db: Database, query: LiteralString, params: tuple[Any, ...] | dict[str, Any] = ()) -> Row:
    async with db.tx() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    assert row is not None, query
    return row


async def fetch_all(db: Database, query: LiteralString, params: tuple[Any, ...] | dict[str, Any] = ()
                    ) -> list[Row]:
    async with db.tx() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def expire_lease(conn: Connection, run_id: uuid.UUID) -> None:
    """Simulate a dead owner: the Run's lease ran out (its recovery may follow in this transaction)."""
    await conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE run_id = %s", (run_id,))


async def scalar(db: Database, query: LiteralString, params: tuple[Any, ...] | dict[str, Any] = ()) -> Any:
    row = await fetch_one(db, query, params)
    return next(iter(row.values()))


async def count_rows(db: Database) -> dict[str, int]:
    """Row counts of every table the repositories write, database-wide (tests run one at a time)."""
    selects = ", ".join(f"(SELECT count(*) FROM {table}) AS {table}" for table in TABLES)
    return dict(await fetch_one(db, f"SELECT {selects}"))  # type: ignore[arg-type]


# A stop's statement that locks every member of its tree (persistence/trees.py), as pg_stat_activity shows it.
STOP_LOCKING_MEMBERS = "ORDER BY session_id FOR NO KEY UPDATE"


async def until_a_lock_is_awaited(db: Database, statement: str, timeout: float = 30.0) -> None:
    """Return once a transaction of this database waits for a lock in a statement that holds
    ``statement``: a race test's other transaction is then where the race needs it, however slow the
    machine (a fixed sleep was not)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock' AND strpos(query, %s) > 0", (statement,)):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no transaction came to wait for a lock in {statement!r}")
        await asyncio.sleep(0.02)


async def run_row(db: Database, run_id: uuid.UUID) -> Row:
    return await fetch_one(db, "SELECT * FROM runs WHERE run_id = %s", (run_id,))


async def turn_row(db: Database, turn_id: uuid.UUID | str) -> Row:
    return await fetch_one(db, "SELECT * FROM turns WHERE turn_id = %s", (uuid.UUID(str(turn_id)),))


async def session_row(db: Database, session_id: uuid.UUID | str) -> Row:
    return await fetch_one(db, "SELECT * FROM sessions WHERE session_id = %s", (uuid.UUID(str(session_id)),))


async def running_in_tree(db: Database, tree_id: uuid.UUID) -> int:
    return await scalar(db, "SELECT count(*) FROM runs WHERE tree_id = %s AND status = 'running'", (tree_id,))


async def seed_worked_tree(db: Database, scope: Scope, *, members: int, turns_per_member: int, wait_every: int = 4,
                           slot_limit: int = 4) -> Tree:
    """A tree of ``members`` sessions (root, children, grandchildren) whose every member has run
    ``turns_per_member`` Turns, each with a model reply calling a tool and its result; every
    ``wait_every``-th Turn parks on its parent (a wait that times out at once) and resumes in a
    second Run. One transaction per member, so a 500-member tree takes seconds, not minutes."""
    tree = await make_tree(db, scope, slot_limit=slot_limit)
    created_by = uuid.uuid4()
    ids = [tree.root_id]
    async with db.tx() as conn:
        root = await sessions.get_session_row(conn, scope, tree.root_id)
        children = max(1, min(members - 1, round((members - 1) ** 0.5)))
        parents = []
        for index in range(children):
            child = await sessions.create_child(conn, root, name=f"c{index:03d}", agent_id=None,
                                                agent_config=AGENT_CONFIG, max_depth=2, max_members=members,
                                                created_by_run_id=created_by)
            ids.append(child["session_id"])
            parents.append(await sessions.get_session_row(conn, scope, child["session_id"]))
        for index in range(members - 1 - children):
            parent = parents[index % len(parents)]
            child = await sessions.create_child(conn, parent, name=f"w{index:04d}", agent_id=None,
                                                agent_config=AGENT_CONFIG, max_depth=2, max_members=members,
                                                created_by_run_id=created_by)
            ids.append(child["session_id"])
    parent_of = {tree.root_id: tree.root_id}
    for session_id in ids:
        async with db.tx() as conn:
            row = await sessions.get_session_row(conn, scope, session_id)
            parent_of[session_id] = row["parent_id"] or session_id
            for number in range(turns_per_member):
                receipt = await turns.submit_input(conn, scope, session_id, f"task {number}", HUMAN)
                run = await _seed_claim(conn, tree.tree_id, session_id)
                call = {"id": f"call-{number}", "name": "list_sessions", "arguments": {}}
                await messages.append_reply(conn, run, content=None, tool_calls=[call],
                                            usage={"prompt_tokens": 40, "completion_tokens": 8}, cost_usd=0.0001)
                if wait_every and number % wait_every == wait_every - 1:
                    wait_id = await waits.park(conn, run, tool_call_id=call["id"], kind="sessions",
                                               condition={"targets": [str(parent_of[session_id])], "after_cursor": 0},
                                               timeout_seconds=0, targets=[parent_of[session_id]])
                    assert await waits.try_resume(conn, wait_id) is not None
                    run = await _seed_claim(conn, tree.tree_id, session_id)
                await messages.append_tool_results(conn, run, [(call["id"], '{"sessions": []}')])
                await turns.finish_turn(conn, run, "completed", output=f"done {receipt['input_id']}")
    return tree


async def age_members(db: Database, tree_id: uuid.UUID, minutes_each: int) -> None:
    """Move the k-th member's whole history (every timestamp the timeline reads) k × ``minutes_each``
    minutes into the past, in tree order: a tree that worked for a while, long enough ago."""
    async with db.tx() as conn:
        await conn.execute("""
            CREATE TEMP TABLE aged ON COMMIT DROP AS
            SELECT session_id, make_interval(mins => %s * (row_number() OVER (ORDER BY path))::int) AS back
            FROM sessions WHERE tree_id = %s""", (minutes_each, tree_id))
        await conn.execute("""UPDATE runs r SET queued_at = queued_at - a.back, started_at = started_at - a.back,
                                  ended_at = ended_at - a.back FROM aged a WHERE r.session_id = a.session_id""")
        await conn.execute("""UPDATE turns t SET created_at = created_at - a.back, ended_at = ended_at - a.back
                              FROM aged a WHERE t.session_id = a.session_id""")
        await conn.execute("""UPDATE waits w SET created_at = created_at - a.back
                              FROM aged a WHERE w.session_id = a.session_id""")
        await conn.execute("""UPDATE thread_messages m SET created_at = created_at - a.back
                              FROM aged a WHERE m.session_id = a.session_id""")


async def _seed_claim(conn: Connection, tree_id: uuid.UUID, session_id: uuid.UUID) -> RunRef:
    granted = await runs.grant_slots(conn, tree_id, LEASE_SECONDS)
    run_id = next(row["run_id"] for row in granted if row["session_id"] == session_id)
    run = await runs.acquire_run(conn, run_id, new_owner(), LEASE_SECONDS)
    assert run is not None
    return run


@contextlib.asynccontextmanager
async def tcp_link(database_url: str) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A TCP way to the database (the embedded server listens on a Unix socket only, where libpq's
    TCP settings do nothing) that can go silent without a word (no RST, no FIN), as a NAT or a load
    balancer drops a connection, or a failed-over database host vanishes: clear the event."""
    info = conninfo_to_dict(database_url)
    socket_path = f"{info['host']}/.s.PGSQL.{info.get('port') or 5432}"
    passing = asyncio.Event()
    passing.set()
    pumps: set[asyncio.Task[None]] = set()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                await passing.wait()
                writer.write(data)
                await writer.drain()

    async def link(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_unix_connection(socket_path)
        pumps.update({asyncio.create_task(pump(client_reader, server_writer)),
                      asyncio.create_task(pump(server_reader, client_writer))})

    server = await asyncio.start_server(link, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield make_conninfo(database_url, host="127.0.0.1", port=port), passing
    finally:
        server.close()
        for task in pumps:
            task.cancel()


# A table of a few hundred rows is read whole faster than through an index, as the planner knows;
# the test's question is whether the statement can be answered from an index without reading the
# history, which is what the planner chooses once the tables hold a real database's history.
PLANNED_AT_SCALE = "SET LOCAL enable_seqscan = off"


class ExplainingConnection:
    """The real connection; each statement also runs once before under ``EXPLAIN ANALYZE``, whose
    plans (what the server says it read) are kept. ``run=False``: a statement runs only under
    ``EXPLAIN ANALYZE`` (a write, which that makes once), and ``execute`` returns None."""

    def __init__(self, conn: Any, *, run: bool = True) -> None:
        self.conn = conn
        self.run = run
        self.plans: list[dict[str, Any]] = []

    async def execute(self, statement: str, arguments: Any = None) -> Any:
        await self._keep(await self.conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, arguments))
        return await self.conn.execute(statement, arguments) if self.run else None

    async def _keep(self, explained: Any) -> None:
        """Keep the plan an ``EXPLAIN (ANALYZE, FORMAT JSON)`` answered."""
        self.plans.append((await explained.fetchone())["QUERY PLAN"][0]["Plan"])


# The partial indexes of queued and running Runs (their entries go with the Run's status).
ACTIVE_RUNS_INDEXES = {"runs_tree_running", "runs_tree_pending", "runs_session_running"}


class GenericPlanExplainingConnection(ExplainingConnection):
    """As :class:`ExplainingConnection`, but the plan kept is the generic one that a prepared
    statement (the pool prepares every statement) may settle on after its first runs: one made
    without the arguments' values. ``EXPLAIN`` of a statement with its arguments bound plans for
    those values whatever ``plan_cache_mode`` says, so the statement is prepared by name and its
    execution explained. Arguments are named (``%(name)s``) or positional (``%s``)."""

    async def execute(self, statement: str, arguments: Any = None) -> Any:
        if isinstance(arguments, dict):
            names = list(dict.fromkeys(_NAMED.findall(statement)))
            numbered = _NAMED.sub(lambda found: f"${names.index(found.group(1)) + 1}", statement)
            values = [arguments[name] for name in names]
        else:
            values = list(arguments or ())
            counter = iter(range(1, len(values) + 1))
            numbered = _POSITIONAL.sub(lambda _: f"${next(counter)}", statement)
        await self.conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # Bound by the client: a server-bound "$1" would be the PREPARE's or the EXECUTE's own parameter.
        explaining = psycopg.AsyncClientCursor(self.conn)
        await explaining.execute(f"PREPARE explained_generic AS {numbered}")  # type: ignore[arg-type]
        try:
            await self._keep(await explaining.execute(  # type: ignore[call-overload]
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE explained_generic ({', '.join(['%s'] * len(values))})",
                values))
        finally:
            await self.conn.execute("DEALLOCATE explained_generic")
        return await self.conn.execute(statement, arguments) if self.run else None


_NAMED = re.compile(r"%\((\w+)\)s")
_POSITIONAL = re.compile(r"%s")


def indexes_read(plan: dict[str, Any], relation: str) -> set[str | None]:
    """The indexes a plan reads ``relation`` through (None: the table itself, whole)."""
    if plan.get("Relation Name") == relation and plan["Node Type"] == "Bitmap Heap Scan":
        return _bitmap_indexes(plan)
    read = {plan.get("Index Name")} if plan.get("Relation Name") == relation else set()
    return read.union(*(indexes_read(child, relation) for child in plan.get("Plans", [])))


def _bitmap_indexes(plan: dict[str, Any]) -> set[str | None]:
    """The indexes a bitmap heap scan's bitmaps come from (its children name no relation)."""
    read = {plan["Index Name"]} if plan["Node Type"] == "Bitmap Index Scan" else set()
    return read.union(*(_bitmap_indexes(child) for child in plan.get("Plans", [])))


def rows_read(plan: dict[str, Any], relation: str) -> int:
    """The rows of ``relation`` a plan (``EXPLAIN (ANALYZE, FORMAT JSON)``'s ``Plan``) reads in its
    scans, kept or filtered out, over all their loops."""
    read = 0
    if plan.get("Relation Name") == relation:
        read = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
                + plan.get("Rows Removed by Index Recheck", 0)) * plan["Actual Loops"]
    return read + sum(rows_read(child, relation) for child in plan.get("Plans", []))
