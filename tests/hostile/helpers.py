"""Reads of durable facts for the hostile-model suite: what a tree left behind, and what the model saw."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from actors.gateways import scripted_log_path
from actors.runtime import Runtime
from persistence.databases import rows


async def workdir_of(runtime: Runtime, tree_id: uuid.UUID) -> Path:
    found = await rows(runtime.db, "SELECT p.workdir FROM projects p JOIN sessions s USING (project_id) "
                       "WHERE s.session_id = %s", tree_id)
    return Path(found[0]["workdir"])


async def footprint(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any]:
    """What a tree has made: its sessions and spawned trees, tool receipts, requests, sandbox lease
    and workdir files (a workdir is shared by a project's trees: each test uses a scope of its own)."""
    sessions = await rows(runtime.db, "SELECT path FROM sessions WHERE tree_id = %s ORDER BY path", tree_id)
    spawned = await rows(runtime.db, "SELECT count(*) AS n FROM trees WHERE lineage_id = %s AND tree_id <> %s",
                         tree_id, tree_id)
    receipts = await rows(runtime.db, "SELECT r.tool_name, r.state FROM tool_receipts r JOIN turns t USING (turn_id) "
                          "JOIN sessions s ON s.session_id = t.session_id WHERE s.tree_id = %s ORDER BY r.created_at",
                          tree_id)
    requests = await rows(runtime.db, "SELECT kind, payload FROM requests WHERE tree_id = %s", tree_id)
    leases = await rows(runtime.db, "SELECT state FROM sandbox_leases WHERE tree_id = %s", tree_id)
    workdir = await workdir_of(runtime, tree_id)
    files = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) if workdir.exists() else []
    return {"sessions": [r["path"] for r in sessions], "spawned_trees": spawned[0]["n"],
            "receipts": [(r["tool_name"], r["state"]) for r in receipts], "requests": requests,
            "sandbox_leases": leases, "files": files}


def model_requests(runtime: Runtime, session_id: uuid.UUID) -> list[dict[str, Any]]:
    """The scripted model's log of the requests made for one session, oldest first: what it was
    offered (tools) and what it read (messages)."""
    log = [json.loads(line) for line in Path(scripted_log_path(runtime.settings)).read_text().splitlines()]
    return [entry for entry in log if f"session_id: {session_id}" in entry["messages"][0]["content"]]


def tool_errors(output: str) -> list[str]:
    """The ``|``-separated errors a test script says back as its final answer."""
    return output.split("|")
