"""The ModelGateway as a Ray actor, with per-call accounting.

Every model call is recorded in ``model_calls`` here, whether or not the caller lives
to commit the reply: model calls are at-least-once and their cost counts each time.
The record is written shortly after the reply is handed back, not before: it is
accounting, not a fact the caller's next step depends on (the Run's own tokens and cost
are committed with the reply), so it stays off every Run's critical path. Only a gateway
that dies in between loses its last records.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator
from typing import Any

from actors import metrics, tracing
from actors.liveness import AnswersApart, answering_actor
from actors.model_gateway import ModelGateway, accounted_name
from persistence import metrics as counters
from persistence import notifications, runs, usage
from persistence.db import Database, LazyDatabase
from persistence.settings import get_settings
from persistence.text import json_text

log = logging.getLogger(__name__)
# litellm's HTTP client logs every request at INFO: a line per model call, nothing an operator needs.
logging.getLogger("httpx").setLevel(logging.WARNING)
# What litellm logs may quote a provider's error text, which an agent's own endpoint or the scripted
# model's script chooses: one line of it, escaped, is kept.
_LITELLM_LINE_CHARS = 1000


class _OneLine(logging.Filter):
    """A record folded into one line (its newlines escaped, its traceback's last line kept) and cut:
    text from outside cannot start a line of its own, such as one that reads as Canopy's JSON."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # arguments that do not fit its format: litellm's bug, not a reason to raise in it
            text = f"{record.msg} {record.args}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        record.msg = text.encode("unicode_escape").decode("ascii")[:_LITELLM_LINE_CHARS]
        record.args = None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


# litellm's loggers have a handler of their own and stamp their records with values JSON cannot
# encode: they stay out of Ray's JSON handler (actors/runtime.py logging_config), say only what
# needs attention, and in one line each.
for _litellm_logger in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
    logging.getLogger(_litellm_logger).propagate = False
    logging.getLogger(_litellm_logger).setLevel(logging.WARNING)
    logging.getLogger(_litellm_logger).addFilter(_OneLine())

DELTA_CHANNEL = "canopy_deltas"
# A NOTIFY payload holds under 8000 bytes; JSON spells a character in up to 12 (a \\u pair).
_DELTA_PIECE_CHARS = 600
# Long enough to gather the calls that end together, short against any model latency.
_RECORD_DELAY_SECONDS = 0.05
# How long a call's reply is kept for a retry of it: longer than a caller waits for its gateway to
# come back (actors/gateways.py RESTART_WAIT_SECONDS) and its last pause before asking again.
REPLY_KEPT_SECONDS = 90.0
# And at most this many characters of them, the oldest forgotten first: a reply may hold a million,
# and a busy node's calls could otherwise keep gigabytes for their 90 s (a retry of a forgotten
# call asks the model again, billed again, as a call would without the keeping).
REPLIES_KEPT_CHARS = 64_000_000
# The error of a call aborted before its reply (model_calls.error).
CALL_ABORTED = ("aborted: the call was cancelled before its reply (its Turn was cancelled, its tree stopped, or "
                "its Run ended)")
# The error of a call aborted because the process that made it is gone.
CALLER_GONE = "aborted: the process that made the call is gone, and nobody else can take its reply"
# A process as the gateway of its node can tell it is still the same one: the machine whose /proc
# shows it (its boot and pid namespace: ``_machine``), its pid, and when it started, in clock ticks
# since the machine booted (``/proc/<pid>/stat``'s 22nd field). In wall-clock time (psutil's
# create_time adds /proc/stat's whole-second boot time) a start moves when the clock is stepped (NTP,
# a VM's resume), and every live caller on the node looked gone.
Caller = tuple[str, int, int]


def this_process() -> Caller | None:
    """The calling process, sent with each model call (actors/gateways.py): calls go to the
    gateway of their own node, which can see whether the process still runs (``_CallsInFlight``).
    None where there is no /proc to tell (the call is then left to its Run's lease)."""
    return _process(os.getpid())


@functools.cache
def _process(pid: int) -> Caller | None:
    """A process's start never changes: read once, not on every model call (keyed by pid, so a
    forked child reads its own)."""
    machine, state = _machine(), _state(pid)
    return None if machine is None or state is None else (machine, pid, state[1])


@functools.cache
def _machine() -> str | None:
    """This machine's boot and pid namespace: the processes of one see each other's pids in /proc,
    so a caller of the same one whose pid runs no more is gone. None where /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _state(pid: int) -> tuple[bytes, int] | None:
    """A process's state letter and start (ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # The command's name (the 2nd field) is in parentheses and may hold spaces or ")": the fields
    # after it start two bytes after the last ")", the state (3rd field) first.
    fields = data[data.rindex(b")") + 2:].split()
    return fields[0], int(fields[19])


def _runs(caller: Caller) -> bool:
    """Whether ``caller`` (a process of this machine) still runs: its pid is not gone, reused, or a zombie."""
    _, pid, started = caller
    state = _state(pid)
    return state is not None and state[1] == started and state[0] != b"Z"


class AccountedGateway(ModelGateway, AnswersApart):
    def __init__(self, *args: Any, node_id: str | None = None, **kwargs: Any) -> None:
        """``node_id``: the Ray node this gateway serves (actors/gateways.py), on each of its records."""
        ModelGateway.__init__(self, *args, **kwargs)
        AnswersApart.__init__(self)
        self._db = LazyDatabase(max_size=4)
        self._recorder = _CallRecorder(self._database, node_id, self.file_model_names)
        self._in_flight = _CallsInFlight(self._database, get_settings().sweep_seconds)
        self._shared = _SharedCalls(REPLY_KEPT_SECONDS, REPLIES_KEPT_CHARS, _reply_chars)

    async def _database(self) -> Database:
        return await self._db.get()

    async def close(self) -> None:
        await self._recorder.flush()
        if self._db.opened is not None:
            await counters.flush(self._db.opened)
        await self._db.close()
        await super().close()

    async def complete_for_run(self, *, call_id: str, run_id: str, caller: Caller | None = None,
                               **arguments: Any) -> dict[str, Any]:
        """A model call of one Run. ``call_id`` names the call across its caller's retries
        (actors/gateways.py): a retry of a call this process still runs, or answered within
        :data:`REPLY_KEPT_SECONDS`, gets that call's reply instead of asking the model again. Ray
        cannot tell a caller whether a call to an unavailable actor ran, so the caller asks again.
        ``caller``: the process that asks (:func:`this_process`); the call is aborted once it is gone.
        See :meth:`_complete_for_run` for the other arguments."""
        return await self._shared.run(call_id, lambda: self._complete_for_run(run_id=run_id, caller=caller,
                                                                              **arguments))

    async def _complete_for_run(self, *, run_id: str, caller: Caller | None, watch: dict[str, str | int] | None = None,
                                trace: dict[str, str] | None = None, **request: Any) -> dict[str, Any]:
        """With ``watch`` (session/tree/turn ids, and the call's step: its number in the Turn) text deltas
        are published live on the ``canopy_deltas`` channel: not persisted, not in the event cursor.
        ``trace``: the calling Run's span context (actors/tracing.py), the model call's parent."""
        started = time.monotonic()
        named = accounted_name(request["model"], request.get("api_base"))  # for a call that never got a reply
        publisher = None if watch is None else _DeltaPublisher(self._database, {**watch, "run_id": run_id})
        reply = None
        with (tracing.remote_span("model call", trace, run_id=run_id, model=str(request["model"])[:200]),
              self._in_flight.call_of(uuid.UUID(run_id), caller) as flight):
            try:
                try:
                    reply = await self.complete(**request, on_delta=publisher.add if publisher else None)
                finally:
                    if publisher is not None:
                        await publisher.drain()  # every delta goes out before the reply is returned
            except asyncio.CancelledError:
                # Aborted (its Turn cancelled, its tree stopped, its Run over, its caller gone): the
                # provider may bill what it generated meanwhile, so the call is a row too, with the
                # usage of its reply when that came in full before the abort (its deltas still going out).
                aborted = flight.aborted or CALL_ABORTED
                if reply is None:
                    self._recorder.add(_Call.failed(run_id, {"model": named, "error": aborted}, started))
                else:
                    self._record(run_id, reply, started, aborted)
                raise
            except Exception as error:
                # Each request that failed is a row; a call that failed before any request is one too,
                # and a reply generated (billed) but not kept is one with its usage.
                attempts = getattr(error, "attempts", None)
                charged = getattr(error, "charged", None)
                for attempt in attempts or ([] if charged else [{"model": named, "error": str(error)}]):
                    self._recorder.add(_Call.failed(run_id, attempt, started))
                if charged:
                    self._recorder.add(_Call(run_id, charged["model"], charged["usage"], charged["cost_usd"], started,
                                             str(error)))
                raise
        self._record(run_id, reply, started, None)
        return reply

    def _record(self, run_id: str, reply: dict[str, Any], started: float, error: str | None) -> None:
        """A reply's call (``error``: why its caller did not take it), after the attempts that failed."""
        for attempt in reply["failed_attempts"]:
            self._recorder.add(_Call.failed(run_id, attempt, started))
        self._recorder.add(_Call(run_id, reply["model"], reply["usage"], reply["cost_usd"], started, error))


def _reply_chars(reply: dict[str, Any]) -> int:
    """About how many characters a reply :meth:`AccountedGateway.complete_for_run` returned holds."""
    message = reply["message"]
    return len(message.get("content") or "") + len(json_text(message.get("tool_calls") or []))


class _SharedCalls:
    """Calls by the key their callers name them by, each run once however often it is asked for.

    A call runs in a task of its own, so a caller that goes does not end it while another waits
    for it; the last waiter to be cancelled cancels it (the provider request is aborted). Its
    outcome stays ``keep_seconds`` after it ends, for a caller whose first answer was lost, while
    the outcomes kept hold at most ``max_kept_chars`` (by ``size``), the oldest forgotten first."""

    def __init__(self, keep_seconds: float, max_kept_chars: int, size: Callable[[Any], int]) -> None:
        self._keep_seconds = keep_seconds
        self._max_kept_chars = max_kept_chars
        self._size = size
        self._calls: dict[str, _SharedCall] = {}
        self._ended: collections.OrderedDict[str, int] = collections.OrderedDict()  # key: its outcome's size
        self._kept_chars = 0

    async def run(self, key: str, start: Callable[[], Awaitable[Any]]) -> Any:
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _SharedCall(asyncio.create_task(start()))
            call.task.add_done_callback(lambda _: self._ended_call(key, call))
        call.waiters += 1
        try:
            return await asyncio.shield(call.task)
        except asyncio.CancelledError:
            if call.waiters == 1:
                call.task.cancel()
            raise
        finally:
            call.waiters -= 1

    def _ended_call(self, key: str, call: _SharedCall) -> None:
        task = call.task
        size = 0 if task.cancelled() or task.exception() is not None else self._size(task.result())
        self._ended[key] = size
        self._kept_chars += size
        call.expiry = asyncio.get_running_loop().call_later(self._keep_seconds, self._forget, key, call)
        while self._kept_chars > self._max_kept_chars and self._ended:
            self._forget(next(iter(self._ended)))

    def _forget(self, key: str, call: _SharedCall | None = None) -> None:
        """Forget the call of ``key`` (only ``call``, if given: a later call may have the key now)."""
        found = self._calls.get(key)
        if found is None or (call is not None and found is not call):
            return
        del self._calls[key]
        self._kept_chars -= self._ended.pop(key, 0)
        if found.expiry is not None:
            found.expiry.cancel()  # a cancelled timer lets go of the call, and so of its reply


@dataclasses.dataclass
class _SharedCall:
    task: asyncio.Task[Any]
    waiters: int = 0
    expiry: asyncio.TimerHandle | None = None  # when its outcome is forgotten


@dataclasses.dataclass(eq=False)
class _Flight:
    """One model call in flight: its task, the process it answers (None: not one of this machine),
    and why it was aborted, once it is."""

    task: asyncio.Task[Any]
    caller: Caller | None
    aborted: str | None = None

    def abort(self, why: str) -> None:
        self.aborted = self.aborted or why
        self.task.cancel()


class _CallsInFlight:
    """The model calls in flight, by Run, and a check every ``every`` seconds that somebody can
    still take their replies.

    Ray cancels the call of a caller that cancels it, not of one that died (its process killed,
    its node lost): a provider would answer that call to its end, billed, while the resumed Run
    asks again. A call goes to the gateway of its caller's node, which sees at once whether that
    process still runs: a call whose caller is gone is aborted (its ``call_id`` is the dead
    process's own, so no retry can take the reply). The Run's row says the rest: a call of a Run
    that is over is aborted too, so a lost ``ray.cancel`` of a cancelled Turn's call ends the same
    way, and a caller of another machine (which this gateway cannot see) is covered once its Run's
    lease is recovered."""

    def __init__(self, database: Callable[[], Awaitable[Database]], every: float) -> None:
        self._database = database
        self._every = every
        self._calls: dict[uuid.UUID, set[_Flight]] = {}
        self._checker: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None  # the checker's read of the Runs' rows

    @contextlib.contextmanager
    def call_of(self, run_id: uuid.UUID, caller: Caller | None) -> Iterator[_Flight]:
        """The current task, a model call of ``run_id`` for ``caller``, aborted if that Run is
        found over or that process gone, at once if it is gone already (it died while its call
        waited for a slot of this gateway). A caller of another machine or pid namespace is never
        taken for gone."""
        task = asyncio.current_task()
        assert task is not None
        seen = caller if caller is not None and caller[0] == _machine() else None
        flight = _Flight(task, seen)
        self._calls.setdefault(run_id, set()).add(flight)
        if seen is not None and not _runs(seen):
            _abort_as_gone(run_id, flight)
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._check_while_any())
        try:
            yield flight
        finally:
            flights = self._calls[run_id]
            flights.discard(flight)
            if not flights:
                del self._calls[run_id]

    async def _check_while_any(self) -> None:
        # The database is read beside the rounds, one read at a time (a checker started again while
        # one still runs starts none): a read that hangs (a database host gone silent) must not hold
        # up the look at this node's processes, nor take one of the pool's connections per round.
        try:
            while self._calls:
                await asyncio.sleep(self._every)
                self._abort_calls_of_gone_callers()
                if self._reading is None or self._reading.done():
                    self._reading = asyncio.create_task(self._abort_calls_of_runs_over())
        except asyncio.CancelledError:
            if self._reading is not None:
                self._reading.cancel()
            raise

    def _abort_calls_of_gone_callers(self) -> None:
        callers = {flight.caller for flights in self._calls.values() for flight in flights if flight.caller}
        gone = {caller for caller in callers if not _runs(caller)}
        for run_id, flights in self._calls.items():
            for flight in flights:
                if flight.caller is not None and flight.caller in gone and not flight.aborted:
                    _abort_as_gone(run_id, flight)

    async def _abort_calls_of_runs_over(self) -> None:
        if not self._calls:
            return
        try:
            db = await self._database()
            async with db.tx() as conn:
                over = await runs.over(conn, list(self._calls))
        except Exception:  # the next round asks again
            log.exception("checking the Runs of %d model call(s) in flight failed", len(self._calls))
            return
        for run_id in over:
            flights = [flight for flight in self._calls.get(run_id, ()) if not flight.aborted]
            for flight in flights:
                flight.abort(CALL_ABORTED)
            if flights:
                log.info("aborted %d model call(s) of run %s: the run is over, nobody takes the reply",
                         len(flights), run_id)


def _abort_as_gone(run_id: uuid.UUID, flight: _Flight) -> None:
    assert flight.caller is not None
    flight.abort(CALLER_GONE)
    log.info("aborted a model call of run %s: the process that made it (pid %d) is gone", run_id, flight.caller[1])


@dataclasses.dataclass
class _Call:
    """One finished model call, as accounted."""

    run_id: str
    model: str
    usage: dict[str, int]
    cost_usd: float | None  # None: litellm has no price for the model
    started: dataclasses.InitVar[float]  # time.monotonic() when the call began
    error: str | None
    latency_ms: float = dataclasses.field(init=False)
    ended_at: datetime.datetime = dataclasses.field(init=False)

    def __post_init__(self, started: float) -> None:
        self.latency_ms = (time.monotonic() - started) * 1000
        self.ended_at = datetime.datetime.now(datetime.UTC)

    @classmethod
    def failed(cls, run_id: str, attempt: dict[str, Any], started: float) -> _Call:
        """A request that failed (``ModelError.attempts``), with its own latency and end when known."""
        call = cls(run_id, attempt["model"], {}, 0.0, started, attempt["error"])
        if "ended_at" in attempt:
            call.latency_ms = attempt["latency_ms"]
            call.ended_at = datetime.datetime.fromtimestamp(attempt["ended_at"], datetime.UTC)
        return call

    def row(self) -> tuple[Any, ...]:
        return (uuid.UUID(self.run_id), self.model, self.usage.get("prompt_tokens", 0),
                self.usage.get("completion_tokens", 0), self.cost_usd, self.latency_ms, self.error, self.ended_at)


class _CallRecorder:
    """Accounts for finished calls in the background, together: calls of parallel Runs tend to
    end together, and one flush a little later — while their next calls are out at the
    provider — records them all in one transaction instead of one each on the gateway's busy
    moment (a record and its metrics cost about as much CPU as litellm's own work per call)."""

    def __init__(self, database: Callable[[], Awaitable[Database]], node_id: str | None,
                 own_models: Callable[[], Collection[str]]) -> None:
        """``own_models``: the operator's models, each counted under its own name (``ModelLabels``)."""
        self._database = database
        self._node_id = node_id
        self._own_models = own_models
        self._pending: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None
        self.labels = counters.ModelLabels(get_settings().default_model)

    def add(self, call: _Call) -> None:
        self._pending.append(call)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(_RECORD_DELAY_SECONDS)
        await self.flush()

    async def flush(self) -> None:
        while self._pending:
            calls, self._pending = self._pending, []
            db: Database | None = None
            try:
                db = await self._database()
                async with db.tx() as conn:
                    if not self.labels.seeded:  # the model labels already counted come before any new one
                        self.labels.seed(await counters.known_label_values(conn, counters.MODEL_CALLS, "model"))
                    await usage.record_model_calls(conn, [(*call.row(), self._node_id) for call in calls])
            except Exception:
                log.exception("recording %d model call(s) failed", len(calls))
            own = self._own_models()
            for call in calls:
                metrics.record_model_call(self.labels.label(call.model, own), call.latency_ms, call.usage,
                                          call.cost_usd, call.error)
            if db is not None:
                counters.flush_soon(db)


class _DeltaPublisher:
    """Publishes one call's text deltas on ``canopy_deltas``. The first goes out at once
    (watchers see the text start); after it they are coalesced: while one notification is
    in flight the next deltas gather, so the stream is not held up by the database and a
    long reply costs a notification per round trip, not one per chunk."""

    def __init__(self, database: Callable[[], Awaitable[Database]], watch: dict[str, str | int]) -> None:
        self._database = database
        self._watch = watch
        self._pending: list[str] = []
        self._started = False
        self._sending: asyncio.Task[None] | None = None

    async def add(self, delta: str) -> None:
        self._pending.append(delta)
        if not self._started:
            self._started = True
            await self._send_pending()
        elif self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send_pending())

    async def drain(self) -> None:
        if self._sending is not None:
            await self._sending

    async def _send_pending(self) -> None:
        # Deltas are a live view, never a fact: failing to publish one must not fail the call.
        try:
            db = await self._database()
            while self._pending:
                text = "".join(self._pending)
                self._pending.clear()
                async with db.tx() as conn:
                    for start in range(0, len(text), _DELTA_PIECE_CHARS):
                        payload = json.dumps({**self._watch, "delta": text[start:start + _DELTA_PIECE_CHARS]})
                        await notifications.notify(conn, DELTA_CHANNEL, payload)
        except Exception:
            log.warning("publishing text deltas of run %s failed; watchers get the final message only",
                        self._watch.get("run_id"), exc_info=True)


GatewayActor = answering_actor(AccountedGateway)
