"""A tree's timeline as Chrome trace-event JSON, the format chrome://tracing and Perfetto open.

Each member is a process (named by its path, ordered as in the tree) with three threads, so
that slices on one thread always nest: 1 "slots" (queued → run → wait, with the human request
inside its wait), 2 "model calls" and 3 "tool calls". Times are microseconds since the Unix
epoch; an interval still open is drawn up to the read's time with ``args.open = true``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from persistence.records import Row
from persistence.statuses import RunKind

SLOTS, MODEL, TOOLS = 1, 2, 3
LANES = {SLOTS: "slots", MODEL: "model calls", TOOLS: "tool calls"}
LANE_OF = {"queued": SLOTS, "run": SLOTS, "wait": SLOTS, "approval": SLOTS, "question": SLOTS,
           "model_call": MODEL, "tool_call": TOOLS}
_ARGS = ("id", "status", "error", "name", "run_id", "turn_id", "wait_id", "request_id", "prompt_tokens",
         "completion_tokens", "cost_usd")


def micros(moment: dt.datetime) -> int:
    """Exact integer microseconds since the epoch (float seconds would lose the last digit)."""
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def _title(item: Row) -> str:
    kind = item["kind"]
    if kind in ("model_call", "tool_call"):
        return str(item["name"])
    if kind == "wait":
        return f"wait ({item['name']})"
    if kind == "run":
        return "run" if item["name"] == RunKind.START else "run (resume)"
    return str(kind)


def trace_events(timeline: Row) -> dict[str, Any]:
    """A read of ``persistence.timeline.timeline`` (a page, or every item) → ``{"traceEvents": [...],
    "displayTimeUnit": "ms"}``."""
    pid_of = {member["session_id"]: index + 1 for index, member in enumerate(timeline["members"])}
    events: list[dict[str, Any]] = []
    for index, member in enumerate(timeline["members"]):
        pid = index + 1
        events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                       "args": {"name": member["path"]}})
        events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                       "args": {"sort_index": index}})
        for tid, lane in LANES.items():
            events.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": lane}})
    as_of = micros(timeline["as_of"])
    for item in timeline["intervals"]:
        start = micros(item["start"])
        end = micros(item["end"]) if item["end"] is not None else max(as_of, start)
        args = {key: str(item[key]) if key.endswith("_id") and item[key] is not None else item[key]
                for key in _ARGS if item.get(key) not in (None, 0, 0.0)}
        if item["end"] is None:
            args["open"] = True
        if item["waits_on"]:
            args["waits_on"] = [str(target) for target in item["waits_on"]]
        events.append({"name": _title(item), "cat": item["kind"], "ph": "X", "ts": start, "dur": end - start,
                       "pid": pid_of[item["session_id"]], "tid": LANE_OF[item["kind"]], "args": args})
    for instant in timeline["instants"]:
        events.append({"name": "Stop all" if instant["kind"] == "stop" else "Continue", "cat": instant["kind"],
                       "ph": "i", "s": "g", "ts": micros(instant["at"]), "pid": pid_of[instant["session_id"]],
                       "tid": SLOTS, "args": {"cursor": instant["id"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
