"""PostgreSQL crashes and comes back while a tree works (a failover, an upgrade, an OOM kill of the
server): every process of the runtime loses every connection at once, mid-transaction, and nothing
can be committed for longer than a lease lasts. The tree must still finish, each side effect once.
In a runtime of its own on a database server of its own (the suite's server is shared by every
test of the process), so it runs in a process of its own; prints one JSON line of findings.

    CANOPY_DATA_DIR=... CANOPY_SESSION_HOSTS=2 python -m tests.actors.database_restart_scenario
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from api import run
from api.app import create_app
from persistence.databases import create_database
from persistence.embedded import embedded_url, running_postmaster
from persistence.records import Scope
from persistence.settings import get_settings
from tests.actors.helpers import eventually, peak_concurrent_runs, rows
from tests.api.conftest import uvicorn_server
from tests.api.helpers import client

MEMBERS = 3
# Longer than a lease (4 s in the tests' environment): every lease has run out when the server is back.
# bench/db_outage.py sets longer ones.
OUTAGE_SECONDS = float(os.environ.get("SCENARIO_OUTAGE_SECONDS", "8"))


def tree_script() -> str:
    """A root that creates the members and waits for them; each member creates a grandchild and
    messages the root (side effects that must happen once), waits, then answers after a model step
    long enough for the outage to fall inside the members' work."""
    def member(index: int) -> str:
        return script(call(create(f"g{index}", script(say(f"g{index} done", delay_ms=1500))),
                           ("send_message", {"target": "/root", "text": f"hello once from m{index}"})),
                      call(("wait_inputs", {"input_ids": ["$${0.input_id}"]}), delay_ms=1500),
                      say(f"m{index} got $${{2.results.0.output}}", delay_ms=1500))
    creates = [create(f"m{index}", member(index)) for index in range(MEMBERS)]
    waits = [f"${{{index}.input_id}}" for index in range(MEMBERS)]
    outputs = " ".join(f"${{{MEMBERS}.results.{index}.output}}" for index in range(MEMBERS))
    return script(call(*creates), call(("wait_inputs", {"input_ids": waits})), say(f"root: {outputs}"))


async def crash_and_restart(data_dir: Path, during: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """SIGQUIT the postmaster (PostgreSQL's immediate shutdown: every backend exits at once, with
    crash recovery at the next start), keep it down while ``during`` runs and at least
    OUTAGE_SECONDS, start it again; the seconds it was down, and what ``during`` returned. The
    moment it is back is ``BACK[0]``."""
    pid = running_postmaster(data_dir)
    assert pid is not None
    os.kill(pid, signal.SIGQUIT)
    down = time.monotonic()
    await eventually(lambda: asyncio.sleep(0, running_postmaster(data_dir) is None), timeout=30)
    seen = await during()
    await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down)))
    await asyncio.to_thread(embedded_url, data_dir)
    BACK.append(time.monotonic())
    return time.monotonic() - down, seen


BACK: list[float] = []


async def cli_watch(runtime: Runtime, scope: Scope, tree_id: uuid.UUID, input_id: uuid.UUID) -> dict[str, Any]:
    """What ``canopy run`` (api/run.py) ends with, watching the tree: its result, or the error that ended it;
    and whether it said the database was unavailable."""
    screen = io.StringIO()
    try:
        # A terminal's console: a Live view writes its updates only to one.
        console = Console(file=screen, width=200, force_terminal=True)
        result = await run._watch(runtime, scope, tree_id, input_id, 300, console)
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"result": None if result is None else [result["status"], result["output"]],
            "said_unavailable": "the database is unavailable" in screen.getvalue()}


async def api_answers(http: httpx.AsyncClient, path: str, count: int) -> list[dict[str, Any]]:
    """``count`` GETs of ``path``, one after the other (the first may meet a connection the crash cut,
    the next a pool that cannot connect)."""
    return [await api_answer(http, path) for _ in range(count)]


async def api_answer(http: httpx.AsyncClient, path: str) -> dict[str, Any]:
    """What the API answers to a GET of ``path``: its status, ``Retry-After``, body and time taken."""
    started = time.monotonic()
    response = await http.get(path)
    return {"status": response.status_code, "retry_after": response.headers.get("retry-after"),
            "body": response.text[:500], "seconds": time.monotonic() - started}


async def main() -> None:
    data_dir = Path(os.environ["CANOPY_DATA_DIR"])
    os.environ["CANOPY_DATABASE_URL"] = create_database(embedded_url(data_dir), "canopy_restart")
    get_settings.cache_clear()
    # As an API replica's runtime: its requests wait this long for a connection (api/app.py).
    runtime = await Runtime.start(num_cpus=2, db_wait_seconds=get_settings().api_db_wait_seconds)
    findings: dict[str, Any] = {}
    try:
        scope = Scope(f"user-{uuid.uuid4().hex[:8]}", "restart")
        async with uvicorn_server(create_app(runtime)) as api, \
                client(api.url, await runtime.create_api_key(scope), timeout=120) as http:
            created = await runtime.create_root(scope, input_text=tree_script())
            tree_id = created["session"]["session_id"]
            path = f"/api/v1/sessions/{tree_id}"
            findings["api_before"] = await api_answer(http, path)
            # Mid-work: a member's first reply (its side effects) is committed, the others' may not be.
            await eventually(lambda: rows(runtime.db, "SELECT 1 FROM coop_messages m JOIN sessions s "
                                          "ON s.session_id = m.sender_session_id WHERE s.tree_id = %s", tree_id))
            # canopy run's view of the tree, watching through the outage.
            watching = asyncio.create_task(cli_watch(runtime, scope, tree_id, created["input"]["input_id"]))
            findings["down_seconds"], findings["api_down"] = await crash_and_restart(
                data_dir, lambda: api_answers(http, path, 2))
            result = await eventually(lambda: _result(runtime, scope, created["input"]["input_id"]), timeout=240)
            # A figure (bench/db_outage.py), not asserted: the tree's own work left, and how soon every
            # process had connections again.
            findings["back_to_result_seconds"] = time.monotonic() - BACK[0]
            findings["result"] = [result["status"], result["output"]]
            findings["cli"] = await watching
            findings["api_after"] = await api_answer(http, path)
        await runtime.wait_tree_idle(scope, tree_id, timeout=120)
        findings.update(await _tree_facts(runtime, tree_id))
    finally:
        await runtime.close(shutdown_ray=True)
        print("FINDINGS " + json.dumps(findings), flush=True)


async def _result(runtime: Runtime, scope: Scope, input_id: uuid.UUID) -> dict[str, Any] | None:
    """The input's result once it has one; None while it runs or while the database is unreachable
    (this driver's connections broke with the server too)."""
    try:
        return await runtime.wait_result(scope, input_id, timeout=5)
    except Exception:  # a timeout, or a connection error while the server is down: ask again
        return None


async def _tree_facts(runtime: Runtime, tree_id: uuid.UUID) -> dict[str, Any]:
    sessions = await rows(runtime.db, "SELECT path FROM sessions WHERE tree_id = %s ORDER BY path", tree_id)
    messages = await rows(runtime.db, "SELECT m.body FROM coop_messages m JOIN sessions s ON s.session_id = "
                          "m.sender_session_id WHERE s.tree_id = %s ORDER BY m.body", tree_id)
    open_inputs = await rows(runtime.db, "SELECT i.status FROM inputs i JOIN sessions s USING (session_id) "
                             "WHERE s.tree_id = %s AND i.status = 'pending'", tree_id)
    interrupted = await rows(runtime.db, "SELECT count(*) AS n FROM runs r JOIN sessions s USING (session_id) "
                             "WHERE s.tree_id = %s AND r.status = 'interrupted'", tree_id)
    turns = await rows(runtime.db, "SELECT t.status, count(*) AS n FROM turns t JOIN sessions s USING (session_id) "
                       "WHERE s.tree_id = %s GROUP BY t.status ORDER BY t.status", tree_id)
    return {"paths": [row["path"] for row in sessions], "messages": [row["body"] for row in messages],
            "open_inputs": [row["status"] for row in open_inputs], "interrupted_runs": interrupted[0]["n"],
            "turns": {row["status"]: row["n"] for row in turns},
            "peak_runs": await peak_concurrent_runs(runtime.db, tree_id)}


if __name__ == "__main__":
    asyncio.run(main())
