"""Opt-in OpenTelemetry spans: Turn → Run → model call → tool call.

Off unless ``CANOPY_OTEL_EXPORTER`` is set (``otlp``: OTLP over HTTP, configured by the
standard ``OTEL_EXPORTER_OTLP_*`` variables, with the ``otlp`` extra installed; ``console``:
the process's stdout; ``file:<directory>``: one JSON line per span in
``<directory>/spans-<pid>.jsonl``, a file per process). Off, every helper here returns at
once and OpenTelemetry is never imported: the hot path pays nothing.

A Turn outlives the processes that work on it (its Runs may run in several actors, one
after another, across waits and crashes), so its span cannot be held open by one of them.
Its ids are derived from the Turn's id instead — the trace id is the Turn id's 128 bits, the
span id their low 64 bits — so every Run, wherever it runs, names the Turn as its parent
without asking anyone, and the Turn's own span is written by the Run that ends the Turn, once
that Run's span has ended: from the Turn's committed start to then. A Turn that ends with no
Run of its own ending it (cancelled while queued or waiting, failed by recovery, cancelled
while its Run's task was being cancelled) has no Turn span; its Runs still name it.
The Run's span context travels to the gateway with the model call (W3C ``traceparent``), so
a model call's span is the Run's child although it runs in the gateway's process. Every span
carries the ids it concerns as attributes (``canopy.tree_id``, ``canopy.session_id``,
``canopy.turn_id``, ``canopy.run_id``) and no message text.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import functools
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from persistence import turns
from persistence.records import RunRef
from persistence.settings import get_settings

if TYPE_CHECKING:
    from persistence.db import Database

log = logging.getLogger(__name__)

_SPAN_ID_MASK = (1 << 64) - 1
# The ids the next span gets, while a Turn's span is written (see _ids_generator).
_fixed_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("canopy_span_ids", default=None)


@functools.cache
def enabled() -> bool:
    return get_settings().otel_exporter is not None and _tracer() is not None


def _turn_ids(turn_id: uuid.UUID) -> tuple[int, int]:
    """The Turn span's (trace id, span id), derived from the Turn's id (both never 0)."""
    return turn_id.int or 1, (turn_id.int & _SPAN_ID_MASK) or 1


_ID_ATTRIBUTES = frozenset({"canopy.tree_id", "canopy.session_id", "canopy.turn_id", "canopy.run_id"})


def _ids(run: RunRef) -> dict[str, str]:
    return {"canopy.tree_id": str(run.tree_id), "canopy.session_id": str(run.session_id),
            "canopy.turn_id": str(run.turn_id), "canopy.run_id": str(run.run_id)}


def _processor(setting: str) -> Any:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    if setting == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.error("CANOPY_OTEL_EXPORTER=otlp needs the OTLP exporter: pip install 'canopy[otlp]'; no spans")
            return None
        return BatchSpanProcessor(OTLPSpanExporter())
    if setting == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter())
    directory = Path(setting.removeprefix("file:")).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    # Line-buffered and written as each span ends: a worker killed later loses none of them.
    out = open(directory / f"spans-{os.getpid()}.jsonl", "a", buffering=1)  # open for the process's life
    return SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n"))


@functools.cache
def _tracer() -> Any:
    """This process's tracer (a provider of Canopy's own, not the global one), or None."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _Ids(RandomIdGenerator):
        """Random ids, except for a Turn's span, whose ids are its Turn's (``_fixed_ids``)."""

        def generate_trace_id(self) -> int:
            fixed = _fixed_ids.get()
            return fixed[0] if fixed else super().generate_trace_id()

        def generate_span_id(self) -> int:
            fixed = _fixed_ids.get()
            return fixed[1] if fixed else super().generate_span_id()

    setting = get_settings().otel_exporter
    assert setting is not None
    processor = _processor(setting)
    if processor is None:
        return None
    provider = TracerProvider(id_generator=_Ids(), resource=Resource.create({"service.name": "canopy"}))
    provider.add_span_processor(processor)
    return provider.get_tracer("canopy")


def _turn_context(turn_id: uuid.UUID) -> Any:
    from opentelemetry import trace

    trace_id, span_id = _turn_ids(turn_id)
    sampled = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    parent = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=sampled)
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


@dataclasses.dataclass
class _Executing:
    """The Run executing in this task: its ids (for the spans under it) and, once ``turn_ended``
    was called, its Turn's terminal status."""

    ids: dict[str, str]
    status: str | None = None


_executing: contextvars.ContextVar[_Executing | None] = contextvars.ContextVar("canopy_run", default=None)


def run_span(db: Database, run: RunRef) -> AbstractAsyncContextManager[Any]:
    """The Run's span, current while it executes: a child of its Turn's span. When the Run ended
    its Turn (``turn_ended``), the Turn's span is written after the Run's span has ended."""
    if not enabled():
        return contextlib.nullcontext()
    return _run_span(db, run)


@contextlib.asynccontextmanager
async def _run_span(db: Database, run: RunRef) -> AsyncIterator[None]:
    executing = _Executing(_ids(run))
    token = _executing.set(executing)
    try:
        with _tracer().start_as_current_span("run", context=_turn_context(run.turn_id),
                                             attributes={**executing.ids, "canopy.run_kind": run.kind}):
            yield
    finally:
        _executing.reset(token)
    if executing.status is not None:
        await _write_turn(db, run, executing.status)


def span(name: str, **attributes: str) -> AbstractContextManager[Any]:
    """A span under the current one (a tool call under its Run), with the executing Run's ids."""
    if not enabled():
        return contextlib.nullcontext()
    executing = _executing.get()
    return _tracer().start_as_current_span(name, attributes={**(executing.ids if executing else {}),
                                                             **{f"canopy.{k}": v for k, v in attributes.items()}})


def carrier() -> dict[str, Any]:
    """Keyword arguments that carry the current span to another process (``trace=...``), or none."""
    if not enabled():
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    executing = _executing.get()
    headers: dict[str, str] = dict(executing.ids) if executing else {}  # the ids travel as attributes
    TraceContextTextMapPropagator().inject(headers)
    return {"trace": headers}


@contextlib.contextmanager
def _remote(name: str, headers: dict[str, str], attributes: dict[str, str]) -> Iterator[Any]:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(headers)
    ids = {key: str(value)[:64] for key, value in headers.items() if key in _ID_ATTRIBUTES}
    with _tracer().start_as_current_span(name, context=context, attributes={**ids, **attributes}) as current:
        yield current


def remote_span(name: str, headers: dict[str, str] | None, **attributes: str) -> AbstractContextManager[Any]:
    """A span whose parent came from another process with ``carrier()`` (the gateway's model call)."""
    if headers is None or not enabled():
        return contextlib.nullcontext()
    return _remote(name, headers, {f"canopy.{k}": v for k, v in attributes.items()})


def _root() -> Any:
    """An empty context: a Turn's span has no parent, whatever span is current."""
    from opentelemetry.context import Context

    return Context()


def _nanoseconds(moment: datetime.datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def turn_ended(status: str) -> None:
    """The executing Run has committed its Turn's end: the Turn's span is written when the Run's ends."""
    executing = _executing.get()
    if executing is not None:
        executing.status = status


async def _write_turn(db: Database, run: RunRef, status: str) -> None:
    """The Turn's span, from its committed start to now (its last Run has just ended). Tracing never
    fails a Turn: an error here is logged and the span is left out."""
    try:
        async with db.tx() as conn:
            times = await turns.turn_times(conn, run.turn_id)
        token = _fixed_ids.set(_turn_ids(run.turn_id))
        try:
            turn = _tracer().start_span("turn", context=_root(), start_time=_nanoseconds(times["created_at"]),
                                        attributes={**_ids(run), "canopy.status": status})
        finally:
            _fixed_ids.reset(token)
        turn.end()
    except Exception:
        log.warning("writing the span of turn %s failed", run.turn_id, exc_info=True)
