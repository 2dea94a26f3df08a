"""Structured logs: the actors write JSON lines (Ray's JSON logging, set by ``init_ray``) and a line per
state change with the ids as fields, read back from the Ray session's log files."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import ray

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.records import Scope
from tests.actors.helpers import eventually, rows, session_id_at


def _lifecycle_lines() -> list[dict[str, Any]]:
    """Every ``canopy.lifecycle`` JSON line in the session's worker logs."""
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    found = []
    for path in logs.glob("worker-*"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"canopy.lifecycle"' in line:
                found.append(json.loads(line))
    return found


async def test_a_turns_lifecycle_is_logged_as_json_lines_with_its_ids(runtime: Runtime, scope: Scope) -> None:
    secret = f"canary-{uuid.uuid4().hex}"  # in the child's task: no log line may carry a message body
    # The child answers late enough that the root's wait parks (its Run is interrupted, then resumed).
    child_script = script(say(f"child says {secret}", delay_ms=1500), task=f"do {secret}")
    text = script(call(create("logged", child_script)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                  say("done"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"])
    assert result["status"] == "completed", result
    tree_id = created["session"]["session_id"]
    child = await session_id_at(runtime.db, tree_id, "/root/logged")
    turn = (await rows(runtime.db, "SELECT turn_id FROM turns WHERE session_id = %s", child))[0]["turn_id"]
    runs = [str(r["run_id"]) for r in await rows(runtime.db, "SELECT run_id FROM runs WHERE turn_id = %s "
                                                             "ORDER BY queued_at", turn)]

    async def turn_lines() -> dict[str, dict[str, Any]] | None:
        lines = sorted((line for line in await asyncio.to_thread(_lifecycle_lines) if line.get("turn_id") == str(turn)),
                       key=lambda line: line["timestamp_ns"])
        first: dict[str, dict[str, Any]] = {}
        for line in lines:  # each change's first line (a busy machine may recover a Run: more lines)
            first.setdefault(line["event"], line)
        wanted = {"turn_started", "run_granted", "run_started", "run_ended", "turn_ended"}
        return first if wanted <= first.keys() else None

    lines = await eventually(turn_lines, timeout=30, every=0.5)
    for event, line in lines.items():
        assert (line["tree_id"], line["session_id"], line["turn_id"]) == (str(tree_id), str(child), str(turn)), event
        assert line["run_id"] in runs, event
        assert line["levelname"] == "INFO" and line["name"] == "canopy.lifecycle", line
        assert line["message"] == event.replace("_", " ")
        assert {"job_id", "worker_id", "node_id", "timestamp_ns"} <= line.keys()  # Ray's own fields
    assert lines["turn_started"]["run_id"] == lines["run_granted"]["run_id"] == runs[0]  # the Turn's first Run
    assert (lines["turn_ended"]["status"], lines["run_ended"]["status"]) == ("completed", "completed")
    assert lines["run_started"]["kind"] == "start"
    # The child's actor (its own, or its host) picked its Run up; the root's started its Turn (create_session).
    assert lines["run_started"]["actor_name"] == runtime.placement.actor_name(child)
    assert lines["turn_started"]["actor_name"] == runtime.placement.actor_name(tree_id)
    started = [lines[event]["timestamp_ns"] for event in ("turn_started", "run_granted", "run_started",
                                                          "run_ended")]
    assert started == sorted(started)
    # The root created the child, then waited: its Run was interrupted, the wait parked and resumed.
    every = await asyncio.to_thread(_lifecycle_lines)
    created_child = [line for line in every if line["event"] == "session_created" and line["session_id"] == str(child)]
    assert [line["actor_name"] for line in created_child] == [runtime.placement.actor_name(tree_id)]
    root_lines = [line for line in every if line.get("session_id") == str(tree_id)]
    events = {line["event"] for line in root_lines}
    assert {"run_interrupted", "wait_parked", "wait_resumed"} <= events, events
    parked = next(line for line in root_lines if line["event"] == "wait_parked")
    assert parked["waiting_for"] == "cooperation"
    assert all(secret not in json.dumps(line) for line in every)
