"""The ``canopy`` command.

- ``canopy up``: the whole local runtime (database, Ray, API + UI) until Ctrl-C (api/up.py).
- ``canopy doctor``: checks what ``canopy up`` needs, each OK or what to do (api/doctor.py).
- ``canopy run "task"``: a task as a new root, its tree live in the terminal (api/run.py).
- ``canopy db init|url``, ``canopy keys create|list|revoke``, ``canopy agents list|create``,
  ``canopy sessions list``, ``canopy tree <id> [--trace out.json]``: operator commands on the database.

Exit codes: 0 done, 1 the command failed (a clear sentence on stderr), 2 the environment or the
command line is wrong (an unreachable database, a port in use, a bad argument).

Operator commands act in the default scope (``local``/``canopy``, the one ``canopy up``
prints a key for) unless ``--user`` / ``--app`` name another.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console

from api import __version__
from api.schemas import AGENT_ID_PATTERN, MAX_KEY_SECONDS, SCOPE_ID_PATTERN
from persistence.db import resolve_database_url
from persistence.errors import CanopyError, DatabaseUnreachable, RayUnreachable
from persistence.migrations import ensure_schema
from persistence.records import Scope
from persistence.settings import Settings, env_names, get_settings

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
                  replicas=args.replicas, expose_ray=args.expose_ray)


def doctor(_: argparse.Namespace) -> int:
    from api.doctor import main as doctor_main

    return doctor_main()


def run(args: argparse.Namespace) -> int:
    from api.run import main as run_main

    return run_main(args.task, scope=_scope(args), agent_id=args.agent, model=args.model, timeout=args.timeout)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h`` or ``30d``, in seconds; 0 for anything else (nan and inf
    among them: float() would take both, and no elapsed time ever exceeds nan), a run of digits too
    long for a float included."""
    match = _DURATION.fullmatch(text.strip())
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)] if match is not None else 0.0
    return seconds if math.isfinite(seconds) else 0.0


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h`` or ``30d``, in seconds: at least one, and no longer than the
    API lets a key live."""
    seconds = _seconds(text)
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 3600, 15m, 12h or 30d (at least 1 s)")
    if seconds > MAX_KEY_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than a key may live ({MAX_KEY_SECONDS // 86400}d)")
    return seconds


def _timeout(text: str) -> float:
    """How long ``canopy run`` waits, written as a duration: more than 0 s, and finite."""
    seconds = _seconds(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a timeout such as 600, 90s or 15m (more than 0 s)")
    return seconds


def _matching(pattern: str, what: str) -> Callable[[str], str]:
    """An argument type: ``pattern`` (the API's) matched by the whole text, newlines included."""
    def check(text: str) -> str:
        if re.fullmatch(pattern, text) is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} ({pattern})")
        return text
    return check


_scope_id = _matching(SCOPE_ID_PATTERN, "a user or app id")
_agent_id = _matching(AGENT_ID_PATTERN, "an agent id")


def _trace_file(text: str) -> Path:
    """Where the trace goes: a file in a directory that exists (checked before the database is asked)."""
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} is not a directory")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory")
    return path


def keys_create(args: argparse.Namespace) -> int:
    from api.operator import create_key

    api_key, row = asyncio.run(create_key(_scope(args), args.expires_in))
    expiry = f"expires {row['expires_at']:%Y-%m-%d %H:%M:%S %Z}" if row["expires_at"] else "never expires"
    print(f"key id {row['key_id']} ({expiry})", file=sys.stderr)
    print(api_key)
    return 0


def keys_list(args: argparse.Namespace) -> int:
    from api.operator import list_keys

    asyncio.run(list_keys(Console(), user_id=args.user, app_id=args.app))
    return 0


def keys_revoke(args: argparse.Namespace) -> int:
    from api.operator import revoke_key

    row = asyncio.run(revoke_key(args.key_id))
    print(f"revoked {row['key_id']} ({row['user_id']}/{row['app_id']}) at {row['revoked_at']:%Y-%m-%d %H:%M:%S %Z}")
    return 0


def agents_list(args: argparse.Namespace) -> int:
    from api.operator import list_agents

    asyncio.run(list_agents(_scope(args), Console()))
    return 0


def agents_create(args: argparse.Namespace) -> int:
    from api.operator import create_agent

    fields = {"agent_id": args.agent_id, "name": args.name or args.agent_id, "description": args.description,
              "model": args.model, "instructions": args.instructions, "tools": args.tool or [],
              "approval_mode": args.approval_mode, "shared": args.shared, "api_base": args.api_base,
              "api_key_ref": args.api_key_ref}
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
        try:
            args.trace.write_text(json.dumps(trace))
        except OSError as error:
            print(f"canopy: cannot write the trace to {args.trace}: {error.strerror}", file=sys.stderr)
            return 2
        print(f"wrote {len(trace['traceEvents'])} trace events to {args.trace} (open it in Perfetto or "
              "chrome://tracing)")
    else:
        asyncio.run(show_tree(_scope(args), args.tree_id, Console()))
    return 0


def _with_scope(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--user", type=_scope_id, default=DEFAULT_SCOPE.user_id,
                        help="scope user id (default: %(default)s)")
    parser.add_argument("--app", type=_scope_id, default=DEFAULT_SCOPE.app_id,
                        help="scope app id (default: %(default)s)")
    return parser


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1 to 65535)")
    return port


def _address(text: str) -> str:
    """An IP address to listen on: the servers bind an address, and a name (localhost) may stand for several."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address (127.0.0.1, ::1, 0.0.0.0)") from None


def _positive(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return count


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="canopy", description="Cooperating LLM sessions on Ray and PostgreSQL")
    root.add_argument("--version", action="version", version=f"canopy {__version__}")
    commands = root.add_subparsers(dest="command", required=True)

    up_parser = commands.add_parser("up", help="start the local runtime: database, Ray, API and UI")
    up_parser.add_argument("--host", type=_address, default="127.0.0.1",
                           help="listen address (default: loopback only)")
    up_parser.add_argument("--port", type=_port, default=8000)
    up_parser.add_argument("--data-dir", type=Path, default=None, help="default: CANOPY_DATA_DIR or ~/.canopy")
    up_parser.add_argument("--dashboard-port", type=_port, default=8265, help="Ray's dashboard (loopback only "
                           "unless --expose-ray)")
    up_parser.add_argument("--replicas", type=_positive, default=1, help="API replicas (Serve deployment)")
    up_parser.add_argument("--expose-ray", action="store_true",
                           help="also open Ray (GCS, raylet, dashboard on --host, agents) beyond loopback: whoever "
                                "holds the Ray token can run code on it; only on a trusted network")
    up_parser.set_defaults(handler=up)

    commands.add_parser("doctor", help="check the database, Ray, Docker, the sandbox image and the model; "
                                       "each OK or what to do").set_defaults(handler=doctor)

    run_parser = _with_scope(commands.add_parser("run", help="run a task as a new root, show its tree live"))
    run_parser.add_argument("task")
    run_parser.add_argument("--agent", type=_agent_id, default=None, help="run the root as this agent")
    run_parser.add_argument("--model", default=None, help="the root's model (a litellm model string)")
    run_parser.add_argument("--timeout", type=_timeout, default=600.0,
                            help="seconds to wait for the result, or 90s, 15m, 2h (default: %(default)s)")
    run_parser.set_defaults(handler=run)

    db = commands.add_parser("db", help="database management").add_subparsers(dest="db_command", required=True)
    db.add_parser("init", help="create the schema, or migrate an existing one forward").set_defaults(handler=db_init)
    db.add_parser("url", help="print the database URL (starts the embedded server if needed)").set_defaults(
        handler=db_url)

    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    key_create = _with_scope(keys.add_parser("create", help="create an API key and print it (its id on stderr)"))
    key_create.add_argument("--expires-in", type=duration, default=None,
                            help="the key expires this long from now: seconds, or 15m, 12h, 30d (default: never)")
    key_create.set_defaults(handler=keys_create)
    key_list = keys.add_parser("list", help="API keys: id, scope, state and dates (never the keys)")
    key_list.add_argument("--user", type=_scope_id, default=None, help="only this user's keys")
    key_list.add_argument("--app", type=_scope_id, default=None, help="only this app's keys")
    key_list.set_defaults(handler=keys_list)
    key_revoke = keys.add_parser("revoke", help="revoke an API key: from now on it answers 401")
    key_revoke.add_argument("key_id", type=uuid.UUID, help="the key's id (see canopy keys list)")
    key_revoke.set_defaults(handler=keys_revoke)

    agents = commands.add_parser("agents", help="the agent directory").add_subparsers(
        dest="agents_command", required=True)
    _with_scope(agents.add_parser("list", help="agents the user may run")).set_defaults(handler=agents_list)
    create = _with_scope(agents.add_parser("create", help="create an agent"))
    create.add_argument("agent_id", type=_agent_id)
    create.add_argument("--name", default=None)
    create.add_argument("--description", default="")
    create.add_argument("--model", default=None)
    create.add_argument("--instructions", default="")
    create.add_argument("--tool", action="append", help="a tool the agent may use (repeatable; none: all)")
    create.add_argument("--approval-mode", choices=("auto", "ask"), default="auto")
    create.add_argument("--shared", action="store_true", help="visible to every user of the app")
    create.add_argument("--api-base", default=None, help="where its model calls go (an OpenAI-compatible server)")
    create.add_argument("--api-key-ref", default=None, metavar="NAME",
                        help="the NAME of the variable or secret file holding the key (never the key itself)")
    create.set_defaults(handler=agents_create)

    sessions = commands.add_parser("sessions", help="sessions").add_subparsers(dest="sessions_command", required=True)
    listing = _with_scope(sessions.add_parser("list", help="root sessions, newest first"))
    listing.add_argument("--limit", type=_positive, default=20)
    listing.add_argument("--archived", action="store_true", help="include archived trees")
    listing.set_defaults(handler=sessions_list)

    tree_parser = _with_scope(commands.add_parser("tree", help="a tree's members and state"))
    tree_parser.add_argument("tree_id", type=uuid.UUID)
    tree_parser.add_argument("--trace", type=_trace_file, default=None, metavar="OUT.json",
                             help="write the tree's timeline as Chrome trace-event JSON instead (for Perfetto)")
    tree_parser.set_defaults(handler=tree)
    return root


def _configure_local_ray(args: argparse.Namespace) -> None:
    """Ray reads two things once, when it is imported, and nothing has imported it yet:

    - whether a Ray started in this process takes the machine's address (and binds its ports
      beyond loopback) or loopback;
    - its authentication mode: token authentication (Ray's default for a new local cluster
      since 2.59), set explicitly so that Ray does not print a notice about its default;
      ``RAY_AUTH_MODE=disabled`` in the environment still turns it off.

    A driver joining a cluster (CANOPY_RAY_ADDRESS) keeps Ray's defaults."""
    if get_settings().ray_address is None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1" if getattr(args, "expose_ray", False) else "0"
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def _invalid_settings(error: ValidationError | SettingsError) -> str:
    """Each setting the environment (or the secrets directory) gives a value it cannot have, by the
    variable an operator sets."""
    if isinstance(error, SettingsError):
        return str(error)
    return "; ".join(
        f"{' or '.join(env_names(str(problem['loc'][0])))}: {problem['msg']}"
        if problem["loc"] and problem["loc"][0] in Settings.model_fields else problem["msg"]
        for problem in error.errors())


def _data_dir(args: argparse.Namespace) -> Path:
    return (getattr(args, "data_dir", None) or get_settings().data_dir).expanduser().resolve()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        get_settings()
    except (ValidationError, SettingsError) as error:
        print(f"canopy: invalid settings: {_invalid_settings(error)}", file=sys.stderr)
        return 2
    _configure_local_ray(args)
    try:
        return int(args.handler(args))
    except (DatabaseUnreachable, RayUnreachable) as error:
        print(f"canopy: {error}", file=sys.stderr)
        return 2
    except (psycopg.DataError, psycopg.IntegrityError) as error:  # a value the schema refuses: the input's fault
        print(f"canopy: the database refused it: {error.diag.message_primary or error}", file=sys.stderr)
        return 2
    except OSError as error:
        data_dir = _data_dir(args)
        if error.filename is None or not Path(error.filename).resolve().is_relative_to(data_dir):
            raise
        print(f"canopy: the data dir {data_dir} cannot be used: {error.strerror} ({error.filename}); choose "
              "another with --data-dir or CANOPY_DATA_DIR", file=sys.stderr)
        return 2
    except CanopyError as error:
        print(f"canopy: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
