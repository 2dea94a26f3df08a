"""The recovery sweeper: re-derives every lost hint from the durable facts.

On start and every ``sweep_seconds`` it recovers Runs whose lease expired, resumes
waits whose condition or deadline is met, fires scheduled inputs that are due
(persistence/schedules.py), pokes trees with queued Runs,
re-activates sessions holding a granted but unowned Run, and releases the sandboxes of
trees idle for ``sandbox_idle_seconds`` (SPEC §12; it looks once in a tenth of that, at least every 10 s) and of
nodes that left the cluster (actors/sandbox_hosts.py), and moves session hosts to the nodes the placement now puts
them on (actors/placement.py), and kills each node's model gateway and sandbox host that answers
nothing, for Ray to start it again (``restart_silent``); every few seconds it also publishes the
runtime's state gauges (actors/metrics.py), and now and then deletes expired watch marks
(persistence/stream_watchers.py). Each record is handled in its own
transaction; one failing record is logged and skipped, the rest proceed, and one failing
step never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ray

from actors import hosting, metrics, ray_compat, sandbox_hosts, sandbox_tools, signals
from actors.naming import NAMESPACE, SWEEPER_NAME, gateway_actor_name, live_nodes, sandbox_host_name
from persistence import receipts, schedules, stream_watchers, turns, waits
from persistence import runs as run_repo
from persistence.db import Database, LazyDatabase
from persistence.metrics import read_gauges
from persistence.records import Row
from persistence.settings import get_settings

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Orphan sandboxes are rare (a claim that died mid-way): listing the engine's containers
# every round would be waste.
_ORPHANS_EVERY_SECONDS = 60.0
# The longest an idle sandbox outlives its idle time (a tenth of it, when that is shorter).
_IDLE_CHECK_MAX_SECONDS = 10.0
# Ray's metrics agent exports every 10 s by default: publishing state gauges more often is waste.
_GAUGES_EVERY_SECONDS = 5.0
# Expired watch marks are ignored by readers; deleting them is housekeeping only.
_WATCHERS_EVERY_SECONDS = 60.0
# How long a dead Run's commands are waited on to stop before a later round asks again: past the
# Docker client's own timeout (sandbox/docker_backend.py) for the few calls a kill makes.
_STOP_COMMANDS_SECONDS = 120.0
# A restarted sweeper asks itself to start until a call comes back (``_ask_to_start``).
_START_ASKS_AFTER_SECONDS = (0.0, 2.0, 5.0, 10.0, 20.0, 30.0)


def _ask_to_start() -> None:
    """Call this sweeper's ``start`` until one call comes back. A restarted actor's constructor
    runs while Ray still has the actor restarting, and a call it makes to itself then was seen
    never to run (a restarted sweeper that never swept), so one is not trusted: ``start`` is a
    no-op once the loop runs, and asking again costs nothing."""
    for delay in _START_ASKS_AFTER_SECONDS:
        time.sleep(delay)
        try:
            # A future, not ray.get: Ray warns of any blocking get inside an async actor.
            ray.get_actor(SWEEPER_NAME, namespace=NAMESPACE).start.remote().future().result(timeout=20)
            return
        except Exception:
            log.warning("asking the restarted sweeper to start failed; asking again", exc_info=True)


class SweeperImpl:
    def __init__(self) -> None:
        self.settings = get_settings()
        self.placement = hosting.current()
        self._db = LazyDatabase(max_size=2)
        # The sandbox manager to release idle sandboxes with; None: every node's sandbox host.
        self.sandboxes: Any = None
        self._task: asyncio.Task[None] | None = None
        # Ray restarts a lost sweeper (its process killed, its node gone) by running this constructor
        # again, and nothing else calls ``start`` then: the sweeper asks itself to start, from a
        # thread, so the asking can wait for the answer (a no-op after Runtime.start's own call).
        if ray.get_runtime_context().get_actor_id() is not None:
            threading.Thread(target=_ask_to_start, name="canopy-sweeper-start", daemon=True).start()
        self._starting: asyncio.Task[None] | None = None
        # The steps whose slow work runs beside the rounds (Docker, process starts), by step.
        self.beside: dict[str, asyncio.Task[None]] = {}
        # The lost Runs whose commands are being stopped beside the rounds, by Run (``_recover``).
        self._stopping: dict[uuid.UUID, asyncio.Task[None]] = {}
        # The sessions being activated beside the rounds, by session (``_poke_queued``).
        self._activating: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.rounds = 0
        self.recoveries = 0
        self._waits_after = waits.SWEEP_START  # where the next round's page of open waits starts
        self.sandboxes_released = 0
        # When each throttled step last ran (loop time), by step.
        self._last_run: dict[str, float] = {}
        self.sandboxes_reaped = 0

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())
            # In the background, so the runtime's start does not wait for more processes: what
            # the placement keeps (shared session hosts) starts with the runtime, not on first use.
            self._starting = asyncio.create_task(self._start_placement())

    async def _start_placement(self) -> None:
        try:
            await self.placement.start()
        except Exception:
            log.exception("starting the placement's actors failed; they start on first use")

    async def stats(self) -> dict[str, int]:
        return {"rounds": self.rounds, "recoveries": self.recoveries,
                "sandboxes_released": self.sandboxes_released, "sandboxes_reaped": self.sandboxes_reaped}

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except Exception:
                log.exception("sweep round failed")
            await asyncio.sleep(self.settings.sweep_seconds)

    async def sweep_once(self, db: Database | None = None) -> None:
        """One round over ``db`` (the sweeper's own pool by default)."""
        db = db or await self._db.get()
        # Each step is isolated too: a failing step (say, a query) never stops the others.
        for step in (self._recover_expired, self._resume_due_waits, self._fire_schedules, self._poke_queued,
                     self._release_idle_sandboxes, self._reap_orphan_sandboxes, self._release_lost_nodes_sandboxes,
                     self._move_hosts, self._restart_silent_actors, self._publish_gauges,
                     self._delete_expired_watchers):
            try:
                await step(db)
            except Exception:
                log.exception("sweep step %s failed; the next round retries", step.__name__)
        self.rounds += 1

    async def _recover_expired(self, db: Database) -> None:
        self._stopping = {run_id: task for run_id, task in self._stopping.items() if not task.done()}
        async with db.tx() as conn:
            expired = await run_repo.expired_runs(conn, skip=list(self._stopping))
        await _each(expired, lambda run_id: self._recover(db, run_id))

    async def _resume_due_waits(self, db: Database) -> None:
        async with db.tx() as conn:
            due, self._waits_after = await waits.waits_to_sweep(conn, self._waits_after)
        await _each(due, lambda wait_id: signals.resume_wait(self.placement, db, wait_id))

    async def _fire_schedules(self, db: Database) -> None:
        async with db.tx() as conn:
            due = await schedules.due_schedules(conn)
        await fire_in_turns(due, self.settings.schedule_firings_per_round,
                            lambda schedule_id: self._fire(db, schedule_id))

    async def _fire(self, db: Database, schedule_id: uuid.UUID) -> bool:
        """Fire the schedule's next due time if it has come, in its own transaction, with its hints
        after the commit; whether one fired."""
        hints = signals.NO_HINTS
        async with db.tx() as conn:
            fired = await schedules.fire_due(conn, schedule_id, self.settings.sweep_seconds)
            if fired is not None and fired["receipt"] is not None:
                started = fired["receipt"]["turn_id"] is not None
                hints = await signals.change_hints(conn, [fired["session_id"]],
                                                   hand_off_tree=fired["tree_id"] if started else None)
        await signals.send_hints(self.placement, db, hints)
        return fired is not None

    async def _poke_queued(self, db: Database) -> None:
        async with db.tx() as conn:
            queued_trees = await run_repo.trees_with_queued_runs(conn)
            unowned = await run_repo.sessions_with_unowned_grants(conn, self.settings.heartbeat_seconds)
        for tree_id in queued_trees:
            self.placement.poke_tree(tree_id)
        # Beside the rounds: a process that is alive but answers nothing (stopped, swapping) holds its
        # hint for the hint's timeout, and the round must not wait for it; nor is a session asked
        # again while it has not answered the last time.
        self._activating = {session: task for session, task in self._activating.items() if not task.done()}
        for session_id in unowned:
            if session_id not in self._activating:
                self._activating[session_id] = asyncio.create_task(_isolated(self.placement.activate, session_id))

    async def _release_idle_sandboxes(self, db: Database) -> None:
        """Release idle sandboxes once in a tenth of their idle time, at least every
        ``_IDLE_CHECK_MAX_SECONDS``: a sandbox goes at most that late. Every round instead, an idle
        cluster asked each node's host (its two queries) every 2 s for sandboxes idle 300 s.

        In the background: releasing a container can take seconds (and is bounded only by
        the manager's own timeout), and recovery must never wait for Docker."""
        every = min(self.settings.sandbox_idle_seconds / 10, _IDLE_CHECK_MAX_SECONDS)
        self._beside_every("sandboxes", every, self._release_idle_sandboxes_now)

    async def _release_idle_sandboxes_now(self) -> None:
        """Per-tree sandbox idle release in every node's sandbox host (actors/sandbox_hosts.py
        ``EveryNode``); each sandbox is isolated inside the manager's ``release_idle``, each node
        inside ``EveryNode``."""
        try:
            released = await (self.sandboxes or sandbox_hosts.EveryNode()).release_idle()
            self.sandboxes_released += len(released)
        except Exception:
            log.exception("sandbox idle release failed; the next round retries")

    async def _reap_orphan_sandboxes(self, db: Database) -> None:
        self._beside_every("orphans", _ORPHANS_EVERY_SECONDS, self._reap_orphan_sandboxes_now)

    async def _reap_orphan_sandboxes_now(self) -> None:
        try:
            reaped = await (self.sandboxes or sandbox_hosts.EveryNode()).reap_orphans()
            self.sandboxes_reaped += len(reaped)
        except Exception:
            log.exception("reaping orphan sandboxes failed; it is tried again in %.0f s", _ORPHANS_EVERY_SECONDS)

    async def _release_lost_nodes_sandboxes(self, db: Database) -> None:
        """A lost node's sandboxes are released now, not at their trees' next commands: until then they
        would count as active, and no host is left on that node to release them when idle."""
        if self._due("lost_nodes", self.settings.node_watch_seconds):
            # Not `+= len(await …)`: that read the count before the await, and lost what the idle
            # release beside it added meanwhile.
            released = await sandbox_hosts.release_on_lost_nodes(db)
            self.sandboxes_released += len(released)

    async def _move_hosts(self, db: Database) -> None:
        """What the placement put by node follows nodes that joined or left (actors/placement.py), in
        the background: a move waits for a process to exit and another to start."""
        self._beside_every("hosts", self.settings.node_watch_seconds, self._move_hosts_now)

    async def _move_hosts_now(self) -> None:
        try:
            for name in await self.placement.follow_nodes():
                log.info("%s moved to the node the placement now puts it on", name)
        except Exception:
            log.exception("moving session hosts failed; the next round retries")

    async def _restart_silent_actors(self, db: Database) -> None:
        """Every node's model gateway and sandbox host that answers nothing is started again
        (``restart_silent``), in the background: a check waits up to ``actor_answer_seconds``."""
        self._beside_every("silent", self.settings.node_watch_seconds, self._restart_silent_actors_now)

    async def _restart_silent_actors_now(self) -> None:
        try:
            nodes = await asyncio.to_thread(live_nodes)
            await restart_silent([name(node) for node in nodes for name in (gateway_actor_name, sandbox_host_name)],
                                 self.settings.actor_answer_seconds)
        except Exception:
            log.exception("checking that each node's gateway and sandbox host answer failed; the next round retries")

    def _beside_every(self, step: str, every_seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        """Start ``work`` beside the rounds once in ``every_seconds``; while the step's previous one
        still runs, at the first round after it ended."""
        running = self.beside.get(step)
        if (running is None or running.done()) and self._due(step, every_seconds):
            self.beside[step] = asyncio.create_task(work())

    async def _publish_gauges(self, db: Database) -> None:
        """The runtime's state gauges for ``ray.util.metrics`` (actors/metrics.py)."""
        if not self._due("gauges", _GAUGES_EVERY_SECONDS):
            return
        async with db.tx() as conn:
            gauges = await read_gauges(conn)
        metrics.publish_gauges(gauges)

    async def _delete_expired_watchers(self, db: Database) -> None:
        if self._due("watchers", _WATCHERS_EVERY_SECONDS):
            async with db.tx() as conn:
                await stream_watchers.delete_expired(conn)

    def _due(self, step: str, every_seconds: float) -> bool:
        """True (and noted) when ``step`` last ran ``every_seconds`` ago or never."""
        now = asyncio.get_running_loop().time()
        if now - self._last_run.get(step, float("-inf")) < every_seconds:
            return False
        self._last_run[step] = now
        return True

    async def _recover(self, db: Database, run_id: uuid.UUID) -> None:
        """A command the dead Run started may still run in its sandbox: it is stopped before the Turn
        may resume. Asking a sandbox host can take long (Docker under load, a host that does not
        answer), so such a Run is recovered beside the rounds, and the other records do not wait."""
        async with db.tx() as conn:
            started = await receipts.started_commands(conn, run_id)
        if started:
            self._stopping[run_id] = asyncio.create_task(self._stop_commands_then_recover(db, run_id, started))
        else:
            await self._recover_stopped(db, run_id)

    async def _stop_commands_then_recover(self, db: Database, run_id: uuid.UUID, started: list[Row]) -> None:
        # A host that cannot be asked now leaves the Run to a later round, which asks again.
        try:
            await asyncio.wait_for(sandbox_tools.stop_commands(db, started), _STOP_COMMANDS_SECONDS)
            await self._recover_stopped(db, run_id)
        except Exception:
            log.exception("stopping the commands of run %s failed; a later round retries", run_id)

    async def _recover_stopped(self, db: Database, run_id: uuid.UUID) -> None:
        async with db.tx() as conn:
            recovered = await turns.recover_expired_run(conn, run_id)
        if recovered:
            self.recoveries += 1
            log.warning("recovered run %s of session %s", run_id, recovered["session_id"])
            await signals.after_change(self.placement, db, [recovered["session_id"]])


async def restart_silent(names: list[str], timeout: float) -> list[str]:
    """Of the per-node actors ``names``, kill those that are alive but answer nothing for ``timeout``
    seconds (their serving loops, asked apart from their calls: actors/liveness.py), for Ray to start
    them again (``max_restarts``); the names killed. A process stopped or stuck (its event loop
    blocked) holds every call of its node without end, and its callers' leases keep their Turns
    running: a killed one's calls fail as lost (a model call is asked again, a sandbox call of a lost
    host takes its tested path). An actor still starting or restarting is not asked (the call waits
    for a start, which may be slow on a loaded node and is no fault), nor killed if it restarted
    while it was asked."""
    before = await asyncio.to_thread(ray_compat.alive_actors)
    asked = [name for name in names if name in before]
    answered = await asyncio.gather(*(_answers(name, timeout) for name in asked))
    silent = [name for name, answers in zip(asked, answered, strict=True) if not answers]
    if not silent:
        return []
    after = await asyncio.to_thread(ray_compat.alive_actors)
    killed = []
    for name in silent:
        if after.get(name) != before[name]:
            continue
        log.error("%s answered nothing for %.0f s: killed, for Ray to start it again", name, timeout)
        await asyncio.to_thread(_kill_for_a_restart, name)
        killed.append(name)
    return killed


def _kill_for_a_restart(name: str) -> None:
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)


async def _answers(name: str, timeout: float) -> bool:
    """Whether the actor ``name`` answers within ``timeout`` seconds; one gone or restarting meanwhile
    counts as answering (there is nothing to kill). Finding it asks Ray's GCS, which may be slow: in a
    thread, not on the sweeper's loop, as the kill is."""
    try:
        async with asyncio.timeout(timeout):
            actor = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
            await actor.answers.remote()
    except TimeoutError:
        return False
    except (ValueError, ray.exceptions.RayActorError):
        pass
    except ray.exceptions.RayTaskError:  # an actor shutting down, its loop closed: nothing stuck to kill
        log.warning("%s failed to answer the check", name, exc_info=True)
    return True


async def fire_in_turns(due: list[uuid.UUID], budget: int, fire: Callable[[uuid.UUID], Awaitable[bool]]) -> None:
    """Fire one due time of each due schedule in turn, then another of each that fired, and so on,
    until none fires or the round's ``budget`` of attempts (each a transaction) is spent: a backlog
    of schedules catching up on all their due times shares the round, and the steps after it (the
    next round's recoveries) wait for at most that many. A schedule whose firing failed waits for
    the next round."""
    while due and budget > 0:
        turn = due[:budget]
        budget -= len(turn)
        due = [schedule_id for schedule_id in turn if await _isolated(fire, schedule_id)]


async def _each(records: list[uuid.UUID], handle: Callable[[uuid.UUID], Awaitable[object]]) -> None:
    for record in records:
        await _isolated(handle, record)


async def _isolated(handle: Callable[[uuid.UUID], Awaitable[_T]], record: uuid.UUID) -> _T | None:
    try:
        return await handle(record)
    except Exception:
        log.exception("sweep of %s failed; continuing with the rest", record)
        return None


Sweeper = ray.remote(SweeperImpl)
