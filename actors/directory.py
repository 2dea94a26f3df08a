"""The live-session directory of a node: the ``max_live_sessions`` cap.

One detached actor per Ray node, ``canopy:directory:<node_id>``, knows which session
actors live on its node, which of them are running a Run (busy) and when each was last
used. Session actors report to it (fire and forget) when they start, pick up work, go
idle and exit. Past the cap (setting ``max_live_sessions``, default 32 per node) the least
recently used *idle* actors are asked to passivate — an idle actor holds nothing a fresh
one could not rebuild from PostgreSQL, and a busy one is never interrupted. So a fan-out
to 500 children keeps at most ``max_live_sessions`` + (busy and starting) session actors.

The directory is a hint, like every signal: if it dies its successor relearns the live
actors from their next report, and an actor it does not know still passivates when it
has been idle for ``actor_idle_seconds``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any

import ray

from actors import ray_compat
from actors.naming import NAMESPACE, NodeLocal, directory_actor_name, node_local_options
from persistence.settings import get_settings

log = logging.getLogger(__name__)

# A busy entry not heard of for this long is checked for liveness (a killed actor never reports).
_STALE_BUSY_SECONDS = 10.0
_PRUNE_EVERY_SECONDS = 5.0
# A process's reports go out together this long after the first of them (see _Outbox).
REPORT_DELAY_SECONDS = 0.05
# Departed incarnations remembered, so that a report of one that arrives after its departure is
# dropped: far more than depart within the time a call can lag behind another.
_DEPARTED_KEPT = 10_000
# Reports held while this node's directory is looked up, past which more are dropped: far more
# than a process's sessions report in the seconds a lookup takes.
_MAX_WAITING = 10_000


@dataclasses.dataclass
class _Entry:
    handle: Any
    owner: str
    busy: bool
    used_at: float


class SessionDirectoryImpl:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.settings = get_settings()
        self.max_live = self.settings.max_live_sessions
        # Least recently used first.
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._evicting: set[str] = set()
        # Owners (session incarnations, never reused) that departed, oldest first.
        self._departed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._prune_task: asyncio.Task[None] | None = None
        self.evictions = 0
        self.peak_live = 0

    # -- reports from session actors ---------------------------------------------------------------

    async def report(self, session_id: str, owner: str, handle: Any, busy: bool) -> None:
        """A session actor started, picked up work (busy) or went idle."""
        self._ensure_pruning()
        if owner in self._departed:
            # Ray keeps no order between two calls to an async actor: this report was made before
            # the departure that overtook it.
            return
        now = time.monotonic()
        entry = self._entries.get(session_id)
        if entry is None or entry.owner != owner:
            entry = self._entries[session_id] = _Entry(handle, owner, busy, now)
            self._evicting.discard(session_id)
        else:
            entry.busy = busy
            entry.used_at = now
        self._entries.move_to_end(session_id)
        self.peak_live = max(self.peak_live, len(self._entries))
        self._enforce()

    async def report_many(self, reports: list[tuple[str, str, Any, bool]]) -> None:
        """One process's reports, in the order they were made (see ``_Outbox``)."""
        for session_id, owner, handle, busy in reports:
            await self.report(session_id, owner, handle, busy)

    async def prestart_worker(self, job_id: str, runtime_env: str) -> None:
        """A dedicated actor of this node took a worker process (see :func:`worker_taken`): the
        raylet is asked for another, so that the next session or supervisor activated here starts
        in a running process (~40 ms) instead of waiting for one to start (~0.6 s here), a wait
        on the critical path of every Run that activates a session. Unused, the worker exits
        after ``actor_idle_seconds``; the raylet starts no more than its CPUs at once."""
        try:
            await asyncio.to_thread(ray_compat.prestart_worker, job_id, runtime_env,
                                    self.settings.actor_idle_seconds)
        except Exception:  # a hint: the next actor then starts a process, as without it
            log.debug("asking the raylet to prestart a worker failed", exc_info=True)

    async def gone(self, session_id: str, owner: str) -> None:
        """A session actor exits (idle timeout, eviction)."""
        self._departed[owner] = None
        while len(self._departed) > _DEPARTED_KEPT:
            self._departed.popitem(last=False)
        entry = self._entries.get(session_id)
        if entry is not None and entry.owner == owner:
            del self._entries[session_id]
            self._evicting.discard(session_id)

    # -- supervisors and operators -----------------------------------------------------------------

    async def configure(self, max_live_sessions: int | None = None) -> dict[str, int]:
        """Change the cap at run time (operators, tests); returns the previous value."""
        previous = {"max_live_sessions": self.max_live}
        if max_live_sessions is not None:
            self.max_live = max(1, max_live_sessions)
            self._enforce()
        return previous

    async def entry(self, session_id: str) -> dict[str, Any] | None:
        """What this directory knows of one session (operators, tests): its incarnation and whether busy."""
        entry = self._entries.get(session_id)
        return None if entry is None else {"owner": entry.owner, "busy": entry.busy}

    async def stats(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "live": len(self._entries),
                "busy": sum(1 for e in self._entries.values() if e.busy), "evicting": len(self._evicting),
                "max_live_sessions": self.max_live, "evictions": self.evictions, "peak_live": self.peak_live}

    # -- the cap -----------------------------------------------------------------------------------

    def _enforce(self) -> None:
        excess = len(self._entries) - self.max_live - len(self._evicting)
        if excess <= 0:
            return
        for session_id, entry in list(self._entries.items()):  # least recently used first
            if excess <= 0:
                break
            if entry.busy or session_id in self._evicting:
                continue
            self._evicting.add(session_id)
            excess -= 1
            self._spawn(self._evict(session_id, entry))

    async def _evict(self, session_id: str, entry: _Entry) -> None:
        try:
            done = await entry.handle.passivate_if_idle.remote(entry.owner)
        except ray.exceptions.RayActorError:
            done = True  # it is gone (the reply may not outlive the exit)
        except Exception:
            log.exception("could not passivate session %s", session_id)
            done = False
        self._evicting.discard(session_id)
        if done and self._entries.get(session_id) is entry:
            del self._entries[session_id]
            self.evictions += 1
        elif not done and self._entries.get(session_id) is entry:
            # It is working again: count it as just used, and let the next least recently used go.
            entry.used_at = time.monotonic()
            self._entries.move_to_end(session_id)
            self._enforce()

    # -- liveness of busy entries (a killed actor never reports) -----------------------------------

    def _ensure_pruning(self) -> None:
        if self._prune_task is None or self._prune_task.done():
            self._prune_task = asyncio.get_running_loop().create_task(self._prune_forever())

    async def _prune_forever(self) -> None:
        """Drop busy entries whose process died (a killed actor never reports). A session whose
        host died and was restarted is replaced by its next incarnation's first report."""
        while True:
            await asyncio.sleep(_PRUNE_EVERY_SECONDS)
            stale = [(sid, e) for sid, e in self._entries.items()
                     if e.busy and time.monotonic() - e.used_at > _STALE_BUSY_SECONDS]
            for session_id, entry in stale:
                try:
                    await asyncio.wait_for(entry.handle.status.remote(), timeout=5)
                except ray.exceptions.RayActorError:
                    if self._entries.get(session_id) is entry:
                        del self._entries[session_id]
                        self._enforce()
                except Exception:
                    pass  # slow or unsure: keep it

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


SessionDirectory = ray.remote(SessionDirectoryImpl)


# -- client side: used by session actors and supervisors ---------------------------------------------

_local = NodeLocal(lambda node_id: SessionDirectory.options(
    **node_local_options(directory_actor_name(node_id), node_id, max_concurrency=1000)).remote(node_id))


def _directory() -> Any:
    """This node's directory (created on first use, pinned to the node)."""
    return _local.handle_blocking()


def directory_handle(node_id: str | None = None) -> Any:
    """A handle to a node's directory (this node's by default), for operators and tests."""
    if node_id is None:
        return _directory()
    return ray.get_actor(directory_actor_name(node_id), namespace=NAMESPACE)


class _Outbox:
    """This process's reports, sent together a little later. A session reports when it starts,
    when it picks up a Run and when it goes idle: a Ray call each was a sizeable share of a
    session host's CPU. Now the reports of sessions that start or finish together share one
    call, and only a session's latest report is sent (it describes the session as it is now)."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[str, Any, bool]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def add(self, session_id: str, owner: str, handle: Any, busy: bool) -> None:
        self._reports.pop(session_id, None)  # re-inserted: the batch keeps the order of use
        self._reports[session_id] = (owner, handle, busy)
        loop = asyncio.get_running_loop()
        # A process that ran another event loop before (a driver) may hold a timer that never fired.
        if self._timer is None or self._timer_loop is not loop:
            self._timer, self._timer_loop = loop.call_later(REPORT_DELAY_SECONDS, self.flush), loop

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._reports:
            return
        batch = [(session_id, *entry) for session_id, entry in self._reports.items()]
        self._reports.clear()
        _tell("report_many", batch)


class _Sender:
    """Sends to this node's directory, in the order they are made. One that must look the directory
    up first (a process's first send, and the first after the directory died: a call to Ray's GCS,
    which takes seconds under load) is made in a thread, and so is every send made behind it until
    it is out: the sender's loop (a session host's: every session's lease renewals and model calls)
    never waits for the GCS. Sends are hints: those behind a lookup that failed are dropped (each
    would wait for a lookup of its own), and so is one past ``_MAX_WAITING``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting = 0  # sends in the thread, not yet out
        self._lookup_failed = False  # since the thread last had nothing to send
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="canopy-directory")

    def tell(self, method: str, *args: Any) -> None:
        try:
            with self._lock:
                handle = _local.kept() if self._waiting == 0 else None
                if handle is not None:
                    _send(handle, method, args)
                elif self._waiting < _MAX_WAITING:
                    self._thread.submit(self._look_up_and_send, method, args)
                    self._waiting += 1
                else:
                    log.debug("dropped a report to this node's directory: %d wait for its lookup", self._waiting)
        except Exception:  # no Ray here (any more), an interpreter shutting down: a hint not sent
            log.debug("could not tell the directory %s", method, exc_info=True)

    def _look_up_and_send(self, method: str, args: tuple[Any, ...]) -> None:
        try:
            if not self._lookup_failed:
                _send(_local.handle_blocking(), method, args)
        except Exception:
            self._lookup_failed = True
            log.debug("could not find this node's directory to tell it %s", method, exc_info=True)
        finally:
            with self._lock:
                self._waiting -= 1
                if self._waiting == 0:
                    self._lookup_failed = False


def _send(handle: Any, method: str, args: tuple[Any, ...]) -> None:
    """Fire and forget (a hint: one that cannot be sent is logged, and its directory looked up again)."""
    try:
        getattr(handle, method).remote(*args)
    except Exception:
        _local.forget(handle)
        log.debug("could not tell the directory %s", method, exc_info=True)


_tell = _Sender().tell
_outbox = _Outbox()


def report(session_id: str, owner: str, handle: Any, busy: bool) -> None:
    """Fire and forget, batched (see ``_Outbox``): the directory is a hint."""
    _outbox.add(session_id, owner, handle, busy)


def worker_taken() -> None:
    """This process is a dedicated actor that just took a worker process of its node: the node's
    directory has the raylet start a replacement, for this process's job and runtime env (the
    ones the next such actor has). Fire and forget."""
    context = ray.get_runtime_context()
    _tell("prestart_worker", context.get_job_id(), context.get_runtime_env_string())


def gone(session_id: str, owner: str) -> None:
    """Sent at once, after this process's pending reports (a departure must not precede them)."""
    _outbox.flush()
    _tell("gone", session_id, owner)

