"""Wait-for deadlock detection: a wait that would close a cycle is refused at once.

Cooperation waits form a graph between Turns. A ``wait_inputs`` Turn needs *all* its inputs to
end, so it is stuck if *any* of them is stuck; an input is stuck behind its own open Turn, or —
while it is queued — behind the open Turn of its session (inputs are served FIFO, so a child
that submits to its waiting parent and then waits for that input waits for the parent's Turn).
A ``wait_sessions`` Turn resumes on an update of *any* target, so it is stuck only if *every*
target's open Turn is stuck (a target without an open Turn, or whose Turn still runs, may yet
update it). Waits for a human (approvals, questions) are not in the graph: a human can end them.

A new wait deadlocks when the waiting Turn would belong to the greatest set of waiting Turns in
which each is stuck by the rule above, given the others are (the greatest fixed point, so a
diamond — two Turns waiting for one that runs — is not a deadlock, and neither is a wait on an
input that has ended). Timeouts do not save a cycle: every member would only time out. A wait
that is due but not yet resumed (what it waits for happened in this very transaction, such as a
message the new waiter sent in the same step, or its deadline passed and the sweep has not come by)
is not stuck: it resumes once this transaction commits. Whether it is due is asked of the waits
module (``waits.is_due``, the rule that resumes it) only when a cycle is found, so a wait that closes
none costs no more.

Only the waits reachable from the new one are read, in one recursive statement (wait_graph.sql), so
a check costs what the new wait's own chain holds, not what every other tree of the scope waits for.

Race-free: every cooperation wait of a scope is checked and committed under the scope's wait
lock (a transaction-scoped advisory lock taken by the check and held until the wait commits),
so of two Turns closing the same cycle at once, the second sees the first's wait and is refused.
"""

from __future__ import annotations

import dataclasses
import uuid

from psycopg.types.json import Jsonb

from persistence import waits
from persistence.db import Connection, advisory_lock, query
from persistence.errors import Deadlock
from persistence.records import RunRef
from persistence.statuses import WaitKind


@dataclasses.dataclass(frozen=True)
class _Waiter:
    """A waiting Turn: where it is, whether it needs every target (inputs) or any (sessions), and
    the Turns it waits on (None for a target that cannot be stuck: ended, idle or starting)."""

    turn_id: uuid.UUID
    wait_id: uuid.UUID | None  # None for the new wait, not written yet
    label: str
    tree_id: uuid.UUID
    needs_all: bool
    on: list[uuid.UUID | None]


async def check_wait(conn: Connection, run: RunRef, label: str, *, input_ids: list[uuid.UUID] | None = None,
                     session_ids: list[uuid.UUID] | None = None) -> None:
    """Raise Deadlock (with the cycle's session paths) if the Run's Turn waiting for these inputs
    (all of them) or sessions (any of them) would close a cycle of waits; else return, holding the
    scope's wait lock until this transaction commits its wait."""
    await advisory_lock(conn, "canopy.waits", run.scope.user_id, run.scope.app_id)
    kind, condition = (WaitKind.INPUTS, {"input_ids": [str(i) for i in input_ids]}) if input_ids is not None \
        else (WaitKind.SESSIONS, {"targets": [str(s) for s in session_ids or []]})
    cur = await conn.execute(query("wait_graph"), {
        "user_id": run.scope.user_id, "app_id": run.scope.app_id, "turn_id": run.turn_id, "kind": kind,
        "condition": Jsonb(condition), "label": label, "tree_id": run.tree_id})
    graph = {row["turn_id"]: _Waiter(row["turn_id"], row["wait_id"], row["path"], row["tree_id"], row["needs_all"],
                                     row["waits_on"])
             for row in await cur.fetchall()}
    stuck = _stuck(graph, run.turn_id)
    if run.turn_id in stuck:
        # Freeing a due wait only frees more: one pass over the first stuck set finds them all.
        for turn in stuck - {run.turn_id}:
            if await waits.is_due(conn, graph[turn].wait_id):  # type: ignore[arg-type]
                del graph[turn]
        stuck = _stuck(graph, run.turn_id)
    if run.turn_id in stuck:
        cycle = _cycle(graph, stuck, run.turn_id)
        names = [_name(graph[turn], run.tree_id) for turn in cycle]
        raise Deadlock(f"waiting would deadlock: {' waits for '.join(names)}; no turn of this cycle could ever "
                       "resume. Wait for something else, or finish without waiting.", names)


def _stuck(graph: dict[uuid.UUID, _Waiter], start: uuid.UUID) -> set[uuid.UUID]:
    """The greatest set of waiting Turns reachable from ``start`` in which each is stuck given the
    others are: everything reachable, less what is freed — a Turn is free once all its targets are
    (it needs all) or once one is (it needs any), and a target that is not a waiting Turn is free.
    A worklist over the reversed edges: linear in the size of the graph."""
    reachable: set[uuid.UUID] = set()
    frontier = [start]
    while frontier:
        turn = frontier.pop()
        if turn in reachable or turn not in graph:
            continue
        reachable.add(turn)
        frontier.extend(t for t in graph[turn].on if t is not None)
    waiting_on: dict[uuid.UUID, list[uuid.UUID]] = {turn: [] for turn in reachable}
    unfree: dict[uuid.UUID, int] = {}
    free: list[uuid.UUID] = []
    for turn in reachable:
        held = [t for t in graph[turn].on if t is not None and t in reachable]
        for target in held:
            waiting_on[target].append(turn)
        frees_now = len(held) < len(graph[turn].on) if not graph[turn].needs_all else not held
        if frees_now or not graph[turn].on:
            free.append(turn)
        unfree[turn] = len(held)
    freed: set[uuid.UUID] = set()
    while free:
        turn = free.pop()
        if turn in freed:
            continue
        freed.add(turn)
        for waiter in waiting_on[turn]:
            if waiter in freed:
                continue
            unfree[waiter] -= 1
            if not graph[waiter].needs_all or unfree[waiter] == 0:
                free.append(waiter)
    return reachable - freed


def _cycle(graph: dict[uuid.UUID, _Waiter], stuck: set[uuid.UUID], start: uuid.UUID) -> list[uuid.UUID]:
    """The shortest path of stuck Turns from ``start`` back to it; if none returns (``start`` waits on
    a cycle it is not part of), the path from ``start`` into that cycle and once around it."""
    came_from: dict[uuid.UUID, uuid.UUID] = {}
    frontier = [start]
    while frontier:
        following = []
        for turn in frontier:
            for after in graph[turn].on:
                if after is None or after not in stuck:
                    continue
                if after == start:
                    path = [turn]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if after not in came_from:
                    came_from[after] = turn
                    following.append(after)
        frontier = following
    path, seen = [start], {start}
    while True:  # every stuck Turn waits on another stuck one: walk until a Turn repeats
        after = next(t for t in graph[path[-1]].on if t is not None and t in stuck)
        path.append(after)
        if after in seen:
            return path
        seen.add(after)


def _name(waiter: _Waiter, home_tree: uuid.UUID) -> str:
    return waiter.label if waiter.tree_id == home_tree else f"{waiter.label} (tree {str(waiter.tree_id)[:8]})"
