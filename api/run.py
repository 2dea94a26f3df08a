"""``canopy run "task"``: a task as a new root, its tree shown live in the terminal, then its result.

It starts (or, with ``CANOPY_RAY_ADDRESS``, joins) Ray in-process, like any driver. Ctrl-C
stops the whole tree (stop all) before leaving, so no member keeps working unseen.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid

import ray
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from actors.runtime import Runtime, init_ray
from api.views import plain, tree_table
from persistence.db import database_unavailable, resolve_database_url
from persistence.errors import CanopyError
from persistence.migrations import connect_failure
from persistence.records import Row, Scope
from persistence.settings import Settings, get_settings
from persistence.statuses import TurnStatus

EXIT_OK, EXIT_FAILED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 130
_POLL_SECONDS = 0.25


def _status_line(result: Row) -> Text:
    styles = {TurnStatus.COMPLETED: "green", TurnStatus.FAILED: "bold red", TurnStatus.CANCELLED: "red"}
    return Text(f"root turn: {result['status']}", style=styles.get(result["status"], "yellow"))


async def _watch(runtime: Runtime, scope: Scope, tree_id: uuid.UUID, input_id: uuid.UUID, timeout: float,
                 console: Console) -> Row | None:
    """Redraw the tree until the root's input is terminal; None on timeout."""
    started = time.monotonic()
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            elapsed = time.monotonic() - started
            try:
                result = await runtime.result(scope, input_id=input_id)
                summary = await runtime.tree_summary(scope, tree_id)
            except Exception as error:
                # A database restarting or failing over: the tree rides it out, and so does its watcher.
                if not database_unavailable(error):
                    raise
                live.update(Text(f"the database is unavailable ({connect_failure(error)}); asking again…",
                                 style="yellow"))
            else:
                live.update(Group(tree_table(summary, elapsed=elapsed), _status_line(result)))
                if result["terminal"]:
                    return result
            if elapsed > timeout:
                return None
            await asyncio.sleep(_POLL_SECONDS)


def _init_ray(settings: Settings) -> None:
    """Start or join Ray without forwarding every worker's log lines into the live view."""
    if not ray.is_initialized():
        init_ray(settings, resolve_database_url(settings), log_to_driver=False, logging_level=logging.WARNING)


async def run_task(task: str, *, scope: Scope, agent_id: str | None, model: str | None, timeout: float,
                   console: Console) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if model:
        # The root's frozen config takes the default model; children inherit it.
        os.environ["CANOPY_DEFAULT_MODEL"] = model
        get_settings.cache_clear()
    settings = get_settings()
    _init_ray(settings)
    runtime = await Runtime.start(settings)
    tree_id: uuid.UUID | None = None
    try:
        created = await runtime.create_root(scope, input_text=task, agent_id=agent_id)
        tree_id = created["session"]["session_id"]
        result = await _watch(runtime, scope, tree_id, created["input"]["input_id"], timeout, console)
        if result is None:
            console.print(f"[red]timed out after {timeout:.0f} s[/red] (the tree keeps running: "
                          f"`canopy tree {tree_id}`)")
            return EXIT_TIMEOUT
        console.print()
        if result["status"] == TurnStatus.COMPLETED:
            console.print(plain(result["output"]), highlight=False)
            return EXIT_OK
        console.print(Text.assemble((str(result["status"]), "red"), ": ", plain(result["error"])), highlight=False)
        return EXIT_FAILED
    except CanopyError as error:
        console.print(plain(error), style="red", highlight=False)
        return EXIT_FAILED
    except (KeyboardInterrupt, asyncio.CancelledError):
        if tree_id is not None:
            await runtime.stop_tree(scope, tree_id)
            console.print(f"[yellow]interrupted: stopped tree {tree_id}[/yellow]")
        return EXIT_INTERRUPTED
    finally:
        await runtime.close(shutdown_ray=True)


def main(task: str, *, scope: Scope, agent_id: str | None, model: str | None, timeout: float) -> int:
    console = Console(stderr=False)
    try:
        return asyncio.run(run_task(task, scope=scope, agent_id=agent_id, model=model, timeout=timeout,
                                    console=console))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        sys.stdout.flush()
