"""End to end on real Ray + PostgreSQL + the scripted model through litellm."""

from __future__ import annotations

import json
import uuid

from actors.runtime import Runtime
from persistence.records import Scope


def script(*steps: dict) -> str:
    return "do the thing\n#!script\n" + json.dumps(list(steps))


async def test_root_creates_children_and_waits(runtime: Runtime, scope: Scope) -> None:
    text = script(
        {"call": [{"name": "create_session", "args": {"name": "a", "description": script({"say": "A done"})}},
                  {"name": "create_session", "args": {"name": "b", "description": script({"say": "B done"})}}]},
        {"call": [{"name": "wait_inputs", "args": {"input_ids": ["${0.input_id}", "${1.input_id}"]}}]},
        {"say": "children said ${2.results.0.output} and ${2.results.1.output}"},
    )
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "completed", result
    assert result["output"] == "children said A done and B done"
    summary = await runtime.tree_summary(scope, created["session"]["session_id"])
    assert sorted(m["path"] for m in summary["members"]) == ["/root", "/root/a", "/root/b"]
    async with runtime.db.tx() as conn:
        cur = await conn.execute(
            "SELECT kind, status FROM runs WHERE turn_id = %s ORDER BY queued_at", (uuid.UUID(str(result["turn_id"])),))
        runs = await cur.fetchall()
    assert [r["kind"] for r in runs] == ["start", "resume"]
    assert runs[0]["status"] == "interrupted"
