"""Per-tree sandbox lifecycle: claim, use, kill, idle release — with the lease in PostgreSQL.

Backend choice (``choose_backend``): ``CANOPY_SANDBOX_BACKEND`` is ``docker`` (the default)
or ``local``; nothing is chosen automatically. ``docker`` never falls back: with no engine
answering, every sandbox use raises ``SandboxUnavailable`` and nothing runs. ``local`` runs
commands on the host as the Canopy user, without isolation, only because the operator said
so; ``backend_warning`` is the line ``canopy up`` prints then.

No transaction is open while a backend builds or removes a sandbox (an image pull, a
container create, start or removal can take seconds to minutes): the lease row lock is held
only to decide, the work is announced by committing ``creating`` or ``releasing``, done, and
settled by a compare-and-set (see ``persistence.sandbox_leases``). On that:

- ``claim`` returns the tree's sandbox handle, creating the sandbox on first use and
  re-adopting it after a restart (the lease row names it and the backend finds it). Two
  claims never make two sandboxes: the second sees ``creating`` and waits, then uses what
  the first made (and a backend's ``ensure`` is idempotent per tree besides). A claim that
  arrives during a release sees ``releasing``, waits until the release settled, then
  builds a fresh sandbox. A claim that fails leaves the lease as it was (no row for a
  first claim). A claim that is cancelled (its command was) stops waiting at once, but the
  round it is in (a decision and the work it announced) runs to its end: the sandbox it was
  making is the tree's next command's.
- A claim that would make a sandbox for a user whose trees hold ``max_per_scope`` already (in
  one app, on every node; counted under the scope's lock) first releases the least recently used
  idle one of theirs on this node; with none idle here it is refused and changes nothing
  (``ScopeFull``, naming the nodes that hold idle ones: their hosts release one on request,
  ``make_room_in_scope``, and the claim is made again). One user's busy trees cannot take every
  container of a node.
- A claim that finds the engine full (``SandboxFull``: ``CANOPY_SANDBOX_MAX_CONTAINERS``) makes
  room by releasing as many of its node's idle sandboxes as it takes, least recently used first
  (idle as for the sweep below, unused for ``_EVICTION_GRACE_SECONDS`` at least), and tries again.
  When fewer are idle it releases none and fails: one scope's idle trees cannot keep every
  other tree of the node from a sandbox for the whole idle window.
- ``release_idle`` is the sweep: a tree whose sandbox is unused for ``idle_seconds`` and
  that has no Run in ``running`` (checked under the row lock that commits ``releasing``)
  and no command in flight in this process is released — processes and ``/tmp`` go, the
  workdir stays. Each tree is handled on its own; one failure is logged and skipped. A Run
  ending never releases anything; only the sweep (or an explicit ``release``) does.
- A process that dies mid-work leaves ``creating`` or ``releasing`` behind. Once older than
  ``TRANSITION_STALE_SECONDS`` the next claim takes it over: it removes the named sandbox
  (idempotently) or builds the sandbox itself. The sweep also finishes stale releases and
  creations, so a tree nobody claims does not stay ``releasing`` (which holds up archiving it)
  or ``creating`` (which holds one of its scope's places, ``SANDBOX_MAX_PER_SCOPE``, for good).
- ``reap_orphans`` removes sandboxes no lease names: made by a claim that died before its
  lease said ``active``, for a tree that never claimed again. A sandbox being born (a fresh
  ``creating``) is never taken for an orphan. Only trees of this database are touched: an
  engine may serve several deployments, and another's sandboxes are not ours to judge.
- ``kill_command`` kills one command by the id its caller gave ``run_command``, from any
  process, even after the one that started it died, and leaves a tombstone: a command of that
  id started later never runs. The kill is kept in the database too (``killed_commands``),
  and ``run_command`` looks for it between its claim and the start: a start still on its way
  when the tree had no sandbox to leave a tombstone in (the first one being made, or one being
  released) never runs either.

The lease names the node the sandbox is on (``node_id``, a manager's own node when it has
one): a manager with a node never claims a sandbox its lease puts on another node
(``SandboxMoved``: the caller asks that node's host, actors/sandbox_hosts.py), and its idle sweep
takes only its node's sandboxes (and those with no node).

Only the lease row is ever locked, and briefly, so every other write of the tree —
messages, runs, the ``trees`` row — keeps committing during a release (SPEC §12).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from persistence import metrics
from persistence import sandbox_leases as leases
from persistence.db import Connection, Database
from persistence.sandbox_leases import SandboxLease
from persistence.settings import Settings, get_settings
from sandbox.base import (
    DEFAULT_TIMEOUT_SECONDS,
    KILLED_EXIT_CODE,
    CommandResult,
    SandboxBackend,
    SandboxFull,
    SandboxGone,
    SandboxMoved,
    SandboxOptions,
    ScopeFull,
    check_command_id,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Removing a sandbox must not hang forever: after this, the lease goes back to what it was.
_RELEASE_TIMEOUT_SECONDS = 120.0
# How often a claim that waits for another process's creating/releasing looks again.
_WAIT_POLL_SECONDS = 0.1
# A sandbox claimed this recently is never released to make room: a caller with no Run (which
# would guard it) may be between its claim and its command's start in another process.
_EVICTION_GRACE_SECONDS = 10.0


def refuse_elsewhere(lease: SandboxLease | None, node_id: str | None) -> None:
    """Raise SandboxMoved when ``lease`` puts the tree's sandbox and workdir on another node than
    ``node_id`` (None: no node in particular). A sandbox or workdir made here would silently start
    empty, and a file written here would be lost to the tree; the caller picked this node from an
    older lease, and asks again."""
    if node_id is not None and lease is not None and lease.node_id not in (None, node_id):
        raise SandboxMoved(f"the tree's sandbox is on another node ({lease.node_id}); ask again")


class SandboxManager:
    def __init__(
        self,
        db: Database,
        backend: SandboxBackend,
        idle_seconds: float | None = None,
        options: SandboxOptions | None = None,
        node_id: str | None = None,
    ) -> None:
        self.db = db
        # The Ray node this manager's sandboxes are on (actors/sandbox_hosts.py), recorded in each
        # lease it creates; None: no node in particular (one machine, tests).
        self.node_id = node_id
        self.backend = backend
        self.idle_seconds = idle_seconds if idle_seconds is not None else get_settings().sandbox_idle_seconds
        self.options = options or SandboxOptions.from_settings(get_settings())
        # Commands this process is running, per tree: the sweep never releases under them,
        # even for callers that have no Run (the runs table is the cross-process guard).
        self._in_flight: collections.Counter[uuid.UUID] = collections.Counter()
        # Claim rounds carried on after their caller was cancelled (``_to_its_end``).
        self._carried_on: set[asyncio.Future[Any]] = set()

    @classmethod
    def from_settings(cls, db: Database, settings: Settings | None = None, node_id: str | None = None) \
            -> SandboxManager:
        settings = settings or get_settings()
        return cls(
            db, choose_backend(settings), settings.sandbox_idle_seconds, SandboxOptions.from_settings(settings),
            node_id,
        )

    # -- use -------------------------------------------------------------------------

    async def claim(self, tree_id: uuid.UUID, workdir: Path) -> str:
        """The tree's sandbox handle: existing, re-adopted, or new. Waits out a creation or release in flight.

        Each round runs to its end even when the claim is cancelled meanwhile (a cancelled command
        is common): a round cut between committing ``creating`` (or ``releasing``) and doing the
        work, or undoing it, left every claim of the tree waiting for it to go stale
        (``TRANSITION_STALE_SECONDS``), minutes. The work a round began is the tree's next
        command's anyway."""
        while (handle := await self._to_its_end(self._claim_round(tree_id, workdir))) is None:
            pass
        return handle

    async def _claim_round(self, tree_id: uuid.UUID, workdir: Path) -> str | None:
        """One decision under the lease's lock and the work it announced: the handle, or None to go on."""
        async with self.db.tx() as conn:
            lease, inserted = await leases.lock(conn, tree_id, self.backend.name)
            step = self._claim_step(lease)
            if step == "create" and not await self._room_in_scope(conn, tree_id):
                step = "make room in scope"
            if step == "reuse":
                await leases.touch(conn, tree_id)
            elif step == "create":
                await leases.begin(conn, tree_id, "creating", self.backend.name, None, self.node_id)
            elif step == "take over release":
                await leases.begin(conn, tree_id, "releasing", lease.backend, lease.handle)
        if step == "wait":
            await asyncio.sleep(_WAIT_POLL_SECONDS)
        elif step == "make room in scope":
            if not await self.make_room_in_scope(tree_id):  # its idle one got busy meanwhile
                async with self.db.tx() as conn:
                    raise ScopeFull(self._scope_full(), await self._idle_elsewhere(conn, tree_id))
        elif step == "take over release":
            log.warning("tree %s: a release stalled; finishing it", tree_id)
            await self._remove(tree_id, lease.backend, lease.handle, restore=("releasing", lease.handle))
        elif step == "reuse":
            assert lease.handle is not None
            if await self.backend.fits(lease.handle, tree_id, workdir, self.options):
                return lease.handle
            # Gone behind our back (docker rm, reboot), or built from other settings (an
            # upgrade, a moved project): forget it; the next round builds (or adopts) one.
            log.warning("sandbox of tree %s vanished or no longer fits its settings; making a new one", tree_id)
            async with self.db.tx() as conn:
                await leases.settle(conn, tree_id, "active", lease.handle, "released", None)
        else:
            try:
                return await self._create(tree_id, workdir, inserted)
            except SandboxFull as full:
                if not await self._make_room(full.needed, "engine"):
                    raise
        return None

    async def _to_its_end(self, work: Coroutine[Any, Any, _T]) -> _T:
        """``work``'s result; a cancelled caller stops waiting for it at once, and it goes on."""
        task = asyncio.ensure_future(work)
        self._carried_on.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._carried_on.discard)
        return await asyncio.shield(task)

    def _claim_step(self, lease: SandboxLease) -> str:
        refuse_elsewhere(lease, self.node_id)
        if lease.state == "active" and lease.handle is not None:
            if lease.backend == self.backend.name:
                return "reuse"
            log.warning(
                "tree %s has a %s sandbox but this runtime uses %s; making a new one",
                lease.tree_id,
                lease.backend,
                self.backend.name,
            )
            return "create"
        if lease.state in ("creating", "releasing") and not lease.stale:
            return "wait"
        return "take over release" if lease.state == "releasing" else "create"

    async def _create(self, tree_id: uuid.UUID, workdir: Path, inserted: bool) -> str | None:
        """Build the sandbox a committed ``creating`` announced; None if another claim took over."""
        try:
            handle = await self.backend.ensure(tree_id, workdir, self.options)
        except BaseException:
            await asyncio.shield(self._undo_creating(tree_id, inserted))
            raise
        async with self.db.tx() as conn:
            if await leases.settle(conn, tree_id, "creating", None, "active", handle):
                return handle
        return None

    async def _room_in_scope(self, conn: Connection, tree_id: uuid.UUID) -> bool:
        """Whether the tree's user may hold one more sandbox in its app (``max_per_scope``). When not,
        and none of theirs on this node is idle, the claim is refused here, its transaction rolled
        back: it changes nothing. When one is, False: the caller releases it and tries again."""
        if await leases.scope_held(conn, tree_id) < self.options.max_per_scope:
            return True
        if await self._idle_here(conn, 1, scope_of=tree_id):
            return False
        raise ScopeFull(self._scope_full(), await self._idle_elsewhere(conn, tree_id))

    async def _idle_elsewhere(self, conn: Connection, tree_id: uuid.UUID) -> list[str]:
        """The other nodes holding idle sandboxes of the tree's user."""
        nodes = await leases.idle_nodes(conn, _EVICTION_GRACE_SECONDS, self.options.max_per_scope, scope_of=tree_id)
        return sorted(nodes - {self.node_id})

    def _scope_full(self) -> str:
        return (
            f"this user's trees already hold {self.options.max_per_scope} sandboxes in this app, the most they "
            "may (CANOPY_SANDBOX_MAX_PER_SCOPE), and none of them is idle; wait until their commands end, or "
            "raise the limit"
        )

    async def make_room_in_scope(self, tree_id: uuid.UUID) -> bool:
        """Release this node's least recently used idle sandbox of the tree's user, for a claim of
        theirs past ``max_per_scope`` (here, or on another node: see ``ScopeFull``); False if none is.
        Runs to its end even when its caller is cancelled: a release cut short holds the lease
        ``releasing`` until it is stale."""
        return await self._to_its_end(self._make_room(1, "scope", scope_of=tree_id))

    async def _idle_here(self, conn: Connection, needed: int, scope_of: uuid.UUID | None = None) -> list[uuid.UUID]:
        """Up to ``needed`` of this node's idle sandboxes (of ``scope_of``'s scope, if given), least
        recently used first, none with a command in flight here."""
        idle = await leases.idle_trees(
            conn, _EVICTION_GRACE_SECONDS, limit=needed + len(self._in_flight), node_id=self.node_id,
            scope_of=scope_of,
        )
        return [tree_id for tree_id in idle if not self._in_flight[tree_id]][:needed]

    async def _make_room(self, needed: int, limit: str, scope_of: uuid.UUID | None = None) -> bool:
        """Release the ``needed`` least recently used idle sandboxes of this node (of ``scope_of``'s
        scope, if given), counted under ``limit``, the limit that wanted them gone (``engine`` or
        ``scope``); False, and none released, if fewer are idle. One that got busy meanwhile is kept:
        the next round counts again."""
        async with self.db.tx() as conn:
            candidates = await self._idle_here(conn, needed, scope_of)
        if len(candidates) < needed:
            return False
        released = False
        for tree_id in candidates:
            try:
                if await self._release_if_idle(tree_id, _EVICTION_GRACE_SECONDS):
                    log.warning("released the idle sandbox of tree %s to make room for another", tree_id)
                    metrics.add(metrics.SANDBOXES_MADE_ROOM, limit=limit)
                    released = True
            except Exception:
                log.exception("releasing the idle sandbox of tree %s to make room failed; skipped", tree_id)
        return released

    async def _undo_creating(self, tree_id: uuid.UUID, inserted: bool) -> None:
        # Leave the lease as this claim found it. A sandbox the backend made anyway (a build
        # cut short may finish in its thread) is an orphan for reap_orphans.
        async with self.db.tx() as conn:
            if inserted:
                await leases.forget_creating(conn, tree_id)
            else:
                await leases.settle(conn, tree_id, "creating", None, "released", None)

    async def touch(self, tree_id: uuid.UUID) -> bool:
        """Mark the tree's sandbox as used now; False if the tree has no active sandbox."""
        async with self.db.tx() as conn:
            return await leases.touch(conn, tree_id)

    async def run_command(
        self,
        tree_id: uuid.UUID,
        workdir: Path,
        command: str,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        command_id: str | None = None,
    ) -> CommandResult:
        """Claim the tree's sandbox and run one command in it (cancel the task to kill it).

        ``command_id`` (default: a fresh one) names the command for ``kill_command``; the
        caller keeps it unique among the tree's running commands."""
        command_id = check_command_id(command_id or uuid.uuid4().hex)
        with self._using(tree_id):
            try:
                result = await self._start(tree_id, workdir, command, timeout_seconds, command_id)
            except SandboxGone:
                # It vanished between claim and start (nothing ran): claim builds a new one.
                log.warning("sandbox of tree %s vanished; claiming it again", tree_id)
                result = await self._start(tree_id, workdir, command, timeout_seconds, command_id)
            await self.touch(tree_id)
            return result

    async def _start(self, tree_id: uuid.UUID, workdir: Path, command: str, timeout_seconds: float,
                     command_id: str) -> CommandResult:
        """Claim the tree's sandbox, then run the command there unless it was killed meanwhile (a
        claim can take minutes): a kill before this check is kept in the database, one after it
        finds the sandbox active and kills the command there (see ``kill_command``)."""
        handle = await self.claim(tree_id, workdir)
        async with self.db.tx() as conn:
            if await leases.was_killed(conn, tree_id, command_id):
                return CommandResult(KILLED_EXIT_CODE, "", "", False)
        return await self.backend.run(handle, command, timeout_seconds, command_id)

    async def kill_command(self, tree_id: uuid.UUID, command_id: str) -> bool:
        """Kill the tree's command ``command_id`` if it still runs, wherever it was started; True if
        it did. Never creates a sandbox. In an existing sandbox it leaves a tombstone of the id (see
        ``SandboxBackend.kill``), also for an unknown or finished id: a command of that id started
        later (by a Run that lost its lease on its way to starting it) exits as killed, never running."""
        check_command_id(command_id)
        async with self.db.tx() as conn:
            lease = await leases.mark_killed(conn, tree_id, command_id)
        if (
            lease is None
            or lease.handle is None
            or lease.state not in ("active", "releasing")
            or lease.backend != self.backend.name
        ):
            return False
        return await self.backend.kill(lease.handle, command_id)

    @contextlib.contextmanager
    def _using(self, tree_id: uuid.UUID) -> Iterator[None]:
        self._in_flight[tree_id] += 1
        try:
            yield
        finally:
            self._in_flight[tree_id] -= 1
            if not self._in_flight[tree_id]:
                del self._in_flight[tree_id]

    # -- release ---------------------------------------------------------------------

    async def release_idle(self, now: datetime.datetime | None = None) -> list[uuid.UUID]:
        """Release every sandbox idle for ``idle_seconds`` before ``now`` (DB clock if None), and
        finish releases whose releaser died.

        Returns the trees released for idleness. Trees with a running Run, a command in flight
        here, or a claim in progress are skipped; a failing tree is logged and skipped.
        """
        async with self.db.tx() as conn:
            candidates = await leases.idle_trees(conn, self.idle_seconds, now, node_id=self.node_id)
            stalled = await leases.stale_transitions(conn, node_id=self.node_id)
        released = []
        for tree_id in candidates:
            if self._in_flight[tree_id]:
                continue
            try:
                if await self._release_if_idle(tree_id, self.idle_seconds, now):
                    released.append(tree_id)
            except Exception:
                log.exception("idle release of the sandbox of tree %s failed; skipped", tree_id)
        for tree_id in stalled:
            if self._in_flight.get(tree_id):  # a claim of this process's own is still at work on it
                continue
            try:
                await self._finish_stalled(tree_id)
            except Exception:
                log.exception("finishing the stalled release or creation of tree %s failed; skipped", tree_id)
        return released

    async def _release_if_idle(self, tree_id: uuid.UUID, idle_seconds: float,
                               now: datetime.datetime | None = None) -> bool:
        async with self.db.tx() as conn:
            lease = await leases.lock_if_idle(conn, tree_id, idle_seconds, now)
            if lease is None or await leases.tree_has_running_run(conn, tree_id):
                return False
            await leases.begin(conn, tree_id, "releasing", lease.backend, lease.handle)
        await self._remove(tree_id, lease.backend, lease.handle, restore=("active", lease.handle))
        return True

    async def release(self, tree_id: uuid.UUID) -> bool:
        """Release the tree's sandbox now, unless a Run of the tree is running. True if released."""
        async with self.db.tx() as conn:
            lease, _ = await leases.lock(conn, tree_id, self.backend.name)
            if lease.state != "active" or await leases.tree_has_running_run(conn, tree_id):
                return False
            await leases.begin(conn, tree_id, "releasing", lease.backend, lease.handle)
        await self._remove(tree_id, lease.backend, lease.handle, restore=("active", lease.handle))
        return True

    async def _finish_stalled(self, tree_id: uuid.UUID) -> None:
        """Release what a stalled release or creation names: a creation's sandbox, built but never
        named by its lease, is an orphan that ``reap_orphans`` removes."""
        async with self.db.tx() as conn:
            lease, _ = await leases.lock(conn, tree_id, self.backend.name)
            if lease.state not in ("releasing", "creating") or not lease.stale:
                return  # someone finished or took it over meanwhile
            await leases.begin(conn, tree_id, "releasing", lease.backend, lease.handle)
        log.warning("tree %s: a %s stalled; releasing it", tree_id,
                    "release" if lease.state == "releasing" else "creation")
        await self._remove(tree_id, lease.backend, lease.handle, restore=(lease.state, lease.handle))

    async def _remove(
        self, tree_id: uuid.UUID, backend: str, handle: str | None, restore: tuple[str, str | None]
    ) -> None:
        """Remove the sandbox a committed ``releasing`` names, with no transaction open, then settle
        the lease: ``released``, or back to ``restore`` if the removal failed."""
        try:
            if handle is not None and backend == self.backend.name:
                await asyncio.wait_for(self.backend.release(handle), _RELEASE_TIMEOUT_SECONDS)
            elif handle is not None:
                log.warning(
                    "tree %s: cannot release a %s sandbox from a %s runtime; forgetting it",
                    tree_id,
                    backend,
                    self.backend.name,
                )
        except Exception:
            async with self.db.tx() as conn:
                await leases.settle(conn, tree_id, "releasing", handle, *restore)
            raise
        async with self.db.tx() as conn:
            await leases.settle(conn, tree_id, "releasing", handle, "released", None)
        log.info("released the sandbox of tree %s", tree_id)

    async def reap_orphans(self) -> list[str]:
        """Release every sandbox of this database's trees that no active lease names.

        Each sandbox is judged under its tree's lease row lock and removed after ``releasing``
        is committed, so a claim meanwhile waits instead of adopting it. Returns the handles
        released; a failing one is logged and skipped. Then what sandboxes removed outside Canopy
        left behind goes too (``remove_leftovers``).
        """
        reaped = []
        for handle, tree_id in (await self.backend.sandboxes()).items():
            try:
                if await self._reap_if_orphan(handle, tree_id):
                    reaped.append(handle)
            except Exception:
                log.exception("reaping sandbox %s of tree %s failed; skipped", handle, tree_id)
        try:
            if left := await self.backend.remove_leftovers():
                log.warning("removed what %d sandboxes removed outside Canopy left behind", left)
        except Exception:
            log.exception("removing the leftovers of removed sandboxes failed; the next round retries")
        return reaped

    async def _reap_if_orphan(self, handle: str, tree_id: uuid.UUID) -> bool:
        async with self.db.tx() as conn:
            if not await leases.tree_known(conn, tree_id):
                return False
            lease, _ = await leases.lock(conn, tree_id, self.backend.name)
            if lease.state == "active" and lease.handle == handle:
                return False
            if lease.state in ("creating", "releasing") and not lease.stale:
                return False  # being born, or being removed by its releaser
            if lease.state != "active":
                await leases.begin(conn, tree_id, "releasing", self.backend.name, handle)
        if lease.state == "active":
            # Another sandbox is the tree's (on another node's engine, or made after this one): this
            # one goes alone, and the lease stays the other's; taking the lease over to release this
            # one would leave the live one unnamed, and its commands unstoppable.
            await asyncio.wait_for(self.backend.release(handle), _RELEASE_TIMEOUT_SECONDS)
        else:
            await self._remove(tree_id, self.backend.name, handle, restore=(lease.state, lease.handle))
        log.warning("reaped orphan sandbox %s of tree %s", handle, tree_id)
        return True

    def close(self) -> None:
        """Close the backend's client resources; the sandboxes and leases stay as they are."""
        self.backend.close()

    async def sweep_forever(self, interval_seconds: float) -> None:
        """Call ``release_idle`` every ``interval_seconds`` until cancelled."""
        while True:
            try:
                await self.release_idle()
            except Exception:  # a DB outage must not end the sweeper
                log.exception("sandbox idle sweep failed")
            await asyncio.sleep(interval_seconds)


def choose_backend(settings: Settings | None = None) -> SandboxBackend:
    """The backend ``CANOPY_SANDBOX_BACKEND`` names. Docker connects on first use: without an
    engine, using it raises ``SandboxUnavailable`` — never a silent switch to the local backend.
    Docker gets an output reader for every slot of every container the node may run (see
    ``sandbox/docker_backend.py``)."""
    settings = settings or get_settings()
    # Imported here: a process carries the dependencies of the backend it uses (the Docker SDK) only.
    if settings.sandbox_backend == "local":
        from sandbox.local_backend import LocalBackend

        return LocalBackend()
    from sandbox.docker_backend import DockerBackend

    return DockerBackend(max_commands=settings.sandbox_stream_threads)


def backend_warning(settings: Settings | None = None) -> str | None:
    """One line for an operator when the configured backend does not isolate commands; else None."""
    settings = settings or get_settings()
    if settings.sandbox_backend != "local":
        return None
    return (
        "WARNING: CANOPY_SANDBOX_BACKEND=local: model commands run on this host as the Canopy user, "
        "NOT isolated (unset it to use Docker)"
    )
