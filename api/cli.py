"""The ``canopy`` command: database management and running a task from the terminal."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from persistence.db import ensure_schema, resolve_database_url
from persistence.records import Scope
from persistence.settings import get_settings

DEFAULT_SCOPE = Scope("local", "canopy")


def db_init(_: argparse.Namespace) -> int:
    url = resolve_database_url()
    created = ensure_schema(url)
    print("schema created" if created else "schema already present")
    return 0


def db_url(_: argparse.Namespace) -> int:
    print(resolve_database_url())
    return 0


async def _run(task: str, agent_id: str | None, timeout: float) -> int:
    from actors.runtime import Runtime

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    runtime = await Runtime.start(get_settings())
    try:
        created = await runtime.create_root(DEFAULT_SCOPE, input_text=task, agent_id=agent_id)
        tree_id: uuid.UUID = created["session"]["session_id"]
        input_id = created["input"]["input_id"]
        shown = ""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            result = await runtime.result(DEFAULT_SCOPE, input_id=input_id)
            summary = await runtime.tree_summary(DEFAULT_SCOPE, tree_id)
            view = "  ".join(f"{m['path']}:{m['activity']}" for m in summary["members"])
            line = f"[slots {summary['slots_in_use']}/{summary['slot_limit']}] {view}"
            if line != shown:
                print(line, flush=True)
                shown = line
            if result["terminal"]:
                break
            if asyncio.get_running_loop().time() > deadline:
                print(f"timed out after {timeout} s", file=sys.stderr)
                return 2
            await asyncio.sleep(0.3)
        print()
        print(result["output"] if result["status"] == "completed" else f"{result['status']}: {result['error']}")
        return 0 if result["status"] == "completed" else 1
    finally:
        await runtime.close(shutdown_ray=True)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args.task, args.agent, args.timeout))


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="canopy", description="Cooperating LLM sessions on Ray and PostgreSQL")
    commands = root.add_subparsers(dest="command", required=True)
    db = commands.add_parser("db", help="database management").add_subparsers(dest="db_command", required=True)
    db.add_parser("init", help="create the schema (fresh-only)").set_defaults(handler=db_init)
    db.add_parser("url", help="print the database URL (starts the embedded server if needed)").set_defaults(
        handler=db_url)
    run_parser = commands.add_parser("run", help="run a task as a new root and print its result")
    run_parser.add_argument("task")
    run_parser.add_argument("--agent", default=None)
    run_parser.add_argument("--timeout", type=float, default=600.0)
    run_parser.set_defaults(handler=run)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
