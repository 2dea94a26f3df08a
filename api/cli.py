"""The ``canopy`` command.

- ``canopy up``: the whole local runtime (database, Ray, API + UI) until Ctrl-C (api/up.py).
- ``canopy run "task"``: a task as a new root, its tree live in the terminal (api/run.py).
- ``canopy db init|url``, ``canopy keys create``, ``canopy agents list|create``,
  ``canopy sessions list``, ``canopy tree <id> [--trace out.json]``: operator commands on the database.

Operator commands act in the default scope (``local``/``canopy``, the one ``canopy up``
prints a key for) unless ``--user`` / ``--app`` name another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path

from rich.console import Console

from persistence.db import resolve_database_url
from persistence.errors import CanopyError
from persistence.migrations import ensure_schema
from persistence.records import Scope

DEFAULT_SCOPE = Scope("local", "canopy")


def _scope(args: argparse.Namespace) -> Scope:
    return Scope(args.user, args.app)


def db_init(_: argparse.Namespace) -> int:
    url = resolve_database_url()
    created = ensure_schema(url)
    print("schema created" if created else "schema already present")
    return 0


def db_url(_: argparse.Namespace) -> int:
    print(resolve_database_url())
    return 0


def up(args: argparse.Namespace) -> int:
    from api.up import up as run_up

    return run_up(host=args.host, port=args.port, data_dir=args.data_dir, dashboard_port=args.dashboard_port,
                  replicas=args.replicas)


def run(args: argparse.Namespace) -> int:
    from api.run import main as run_main

    return run_main(args.task, scope=_scope(args), agent_id=args.agent, model=args.model, timeout=args.timeout)


def keys_create(args: argparse.Namespace) -> int:
    from api.operator import create_key

    print(asyncio.run(create_key(_scope(args))))
    return 0


def agents_list(args: argparse.Namespace) -> int:
    from api.operator import list_agents

    asyncio.run(list_agents(_scope(args), Console()))
    return 0


def agents_create(args: argparse.Namespace) -> int:
    from api.operator import create_agent

    fields = {"agent_id": args.agent_id, "name": args.name or args.agent_id, "description": args.description,
              "model": args.model, "instructions": args.instructions, "tools": args.tool or [],
              "approval_mode": args.approval_mode, "shared": args.shared}
    asyncio.run(create_agent(_scope(args), fields, Console()))
    return 0


def sessions_list(args: argparse.Namespace) -> int:
    from api.operator import list_sessions

    asyncio.run(list_sessions(_scope(args), Console(), limit=args.limit, include_archived=args.archived))
    return 0


def tree(args: argparse.Namespace) -> int:
    from api.operator import show_tree, tree_trace

    if args.trace is not None:
        trace = asyncio.run(tree_trace(_scope(args), args.tree_id))
        args.trace.write_text(json.dumps(trace))
        print(f"wrote {len(trace['traceEvents'])} trace events to {args.trace} (open it in Perfetto or "
              "chrome://tracing)")
    else:
        asyncio.run(show_tree(_scope(args), args.tree_id, Console()))
    return 0


def _with_scope(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--user", default=DEFAULT_SCOPE.user_id, help="scope user id (default: %(default)s)")
    parser.add_argument("--app", default=DEFAULT_SCOPE.app_id, help="scope app id (default: %(default)s)")
    return parser


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="canopy", description="Cooperating LLM sessions on Ray and PostgreSQL")
    commands = root.add_subparsers(dest="command", required=True)

    up_parser = commands.add_parser("up", help="start the local runtime: database, Ray, API and UI")
    up_parser.add_argument("--host", default="127.0.0.1", help="listen address (default: loopback only)")
    up_parser.add_argument("--port", type=int, default=8000)
    up_parser.add_argument("--data-dir", type=Path, default=None, help="default: CANOPY_DATA_DIR or ~/.canopy")
    up_parser.add_argument("--dashboard-port", type=int, default=8265)
    up_parser.add_argument("--replicas", type=int, default=1, help="API replicas (Serve deployment)")
    up_parser.set_defaults(handler=up)

    run_parser = _with_scope(commands.add_parser("run", help="run a task as a new root, show its tree live"))
    run_parser.add_argument("task")
    run_parser.add_argument("--agent", default=None, help="run the root as this agent")
    run_parser.add_argument("--model", default=None, help="the root's model (a litellm model string)")
    run_parser.add_argument("--timeout", type=float, default=600.0)
    run_parser.set_defaults(handler=run)

    db = commands.add_parser("db", help="database management").add_subparsers(dest="db_command", required=True)
    db.add_parser("init", help="create the schema (fresh-only)").set_defaults(handler=db_init)
    db.add_parser("url", help="print the database URL (starts the embedded server if needed)").set_defaults(
        handler=db_url)

    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    _with_scope(keys.add_parser("create", help="create an API key and print it")).set_defaults(handler=keys_create)

    agents = commands.add_parser("agents", help="the agent directory").add_subparsers(
        dest="agents_command", required=True)
    _with_scope(agents.add_parser("list", help="agents the user may run")).set_defaults(handler=agents_list)
    create = _with_scope(agents.add_parser("create", help="create an agent"))
    create.add_argument("agent_id")
    create.add_argument("--name", default=None)
    create.add_argument("--description", default="")
    create.add_argument("--model", default=None)
    create.add_argument("--instructions", default="")
    create.add_argument("--tool", action="append", help="a tool the agent may use (repeatable; none: all)")
    create.add_argument("--approval-mode", choices=("auto", "ask"), default="auto")
    create.add_argument("--shared", action="store_true", help="visible to every user of the app")
    create.set_defaults(handler=agents_create)

    sessions = commands.add_parser("sessions", help="sessions").add_subparsers(dest="sessions_command", required=True)
    listing = _with_scope(sessions.add_parser("list", help="root sessions, newest first"))
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--archived", action="store_true", help="include archived trees")
    listing.set_defaults(handler=sessions_list)

    tree_parser = _with_scope(commands.add_parser("tree", help="a tree's members and state"))
    tree_parser.add_argument("tree_id", type=uuid.UUID)
    tree_parser.add_argument("--trace", type=Path, default=None, metavar="OUT.json",
                             help="write the tree's timeline as Chrome trace-event JSON instead (for Perfetto)")
    tree_parser.set_defaults(handler=tree)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except CanopyError as error:
        print(f"canopy: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
