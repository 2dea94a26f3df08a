"""The operator commands (``canopy keys|agents|sessions|tree``) on the test database, and
``canopy run`` joining the test session's Ray cluster (CANOPY_RAY_ADDRESS) as a real subprocess."""

from __future__ import annotations

import asyncio
import datetime
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import ray
from ray.util.state import list_jobs

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.migrations import ensure_schema
from persistence.records import Scope
from tests.api.conftest import ApiServer
from tests.api.helpers import clean_env, client, rows

REPO = Path(__file__).resolve().parents[2]


async def canopy(runtime: Runtime, *args: str, join_ray: bool = False, timeout: float = 120.0,
                 unset: tuple[str, ...] = ()) -> tuple[int, str]:
    """Run the command (without the variables ``unset``); its exit code and its stdout (stderr, Ray's
    worker logs included, only on failure)."""
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", *unset)}
    env.update({"CANOPY_DATABASE_URL": runtime.database_url, "CANOPY_DATA_DIR": str(runtime.settings.data_dir),
                "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    if join_ray:
        env["CANOPY_RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "api.cli", *args, cwd=REPO, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode() + ("" if process.returncode == 0 else "\n" + err.decode()[-3000:])


async def test_operator_commands(api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    who = ["--user", scope.user_id, "--app", scope.app_id]
    code, out = await canopy(runtime, "keys", "create", *who)
    assert code == 0, out
    api_key = out.strip().splitlines()[-1]
    async with client(api.url, api_key) as http:
        root = (await http.post("/api/v1/sessions", json={"title": "from the cli test"})).json()["session"]
    code, out = await canopy(runtime, "agents", "create", "helper", "--name", "Helper", "--approval-mode", "ask",
                             *who)
    assert code == 0 and "helper" in out, out
    code, out = await canopy(runtime, "agents", "list", *who)
    assert code == 0 and "helper" in out and "ask" in out, out
    code, out = await canopy(runtime, "sessions", "list", *who)
    assert code == 0 and root["session_id"] in out and "from the cli test" in out, out
    code, out = await canopy(runtime, "tree", root["session_id"], *who)
    assert code == 0 and "/root" in out and "slots 0/4" in out, out
    code, out = await canopy(runtime, "tree", str(uuid.uuid4()), *who)
    assert code == 1 and "no tree" in out, out


async def test_agents_create_checks_the_model_and_its_key_name(runtime: Runtime, scope: Scope) -> None:
    who = ["--user", scope.user_id, "--app", scope.app_id]
    endpoint = ["--model", "openai/qwen", "--api-base", "http://127.0.0.1:9/v1"]
    code, out = await canopy(runtime, "agents", "create", "remote", *endpoint, "--api-key-ref", "NO_SUCH_PROVIDER_KEY",
                             *who)
    assert code == 1 and "canopy: api_key_ref 'NO_SUCH_PROVIDER_KEY' names no key" in out and "Traceback" not in out
    assert await rows(runtime.db, "SELECT agent_id FROM agents WHERE app_id = %s", scope.app_id) == []
    code, out = await canopy(runtime, "agents", "create", "remote", *endpoint, *who)
    assert code == 0 and "remote" in out, out
    assert await rows(runtime.db, "SELECT api_base, api_key_ref FROM agents WHERE app_id = %s", scope.app_id) == [
        {"api_base": "http://127.0.0.1:9/v1", "api_key_ref": None}]


async def test_canopy_run_joins_the_cluster_and_prints_the_result(runtime: Runtime, scope: Scope) -> None:
    who = ["--user", scope.user_id, "--app", scope.app_id]
    task = script(call(create("helper", script(say("helped")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("result: ${1.results.0.output}"))
    code, out = await canopy(runtime, "run", task, *who, join_ray=True)
    assert code == 0, out
    assert out.rstrip().endswith("result: helped")
    assert "helper" in out and "slots" in out  # the live tree view
    # What a provider or a model wrote is printed as text: not rich markup, nor escape sequences
    # the terminal would act on (here a clipboard write).
    down = "the provider is down [link=https://evil.example]x[/link] \x1b]52;c;ZXZpbA==\x1b\\"
    code, out = await canopy(runtime, "run", script({"fail": down}), *who, join_ray=True)
    assert code == 1 and "failed" in out, out
    assert "[link=https://evil.example]x[/link] ⟨U+001B⟩]52;c;ZXZpbA==⟨U+001B⟩\\" in out and "\x1b]52" not in out, out
    # The jobs' runtime_env (which Ray's dashboard shows) carries the secrets directory, never a secret.
    jobs = await asyncio.to_thread(list_jobs, address=ray.get_runtime_context().gcs_address, detail=True)
    joined = [job.runtime_env for job in jobs if "CANOPY_SECRETS_DIR" in (job.runtime_env or {}).get("env_vars", {})]
    assert len(joined) >= 2, [job.runtime_env for job in jobs]
    for runtime_env in joined:
        shown = json.dumps(runtime_env)
        assert runtime.database_url not in shown and "CANOPY_DATABASE_URL" not in shown


async def test_joining_a_cluster_without_its_token_mode_says_what_to_set(runtime: Runtime, scope: Scope) -> None:
    """Ray sends its token to an address it is given only with RAY_AUTH_MODE=token set before it is
    imported. Without it, a cluster with token authentication (the suite's Ray, as Ray's default)
    answered "Failed to connect" in a traceback; it is one line saying what to set, and nothing starts."""
    assert os.environ.get("RAY_AUTH_MODE") == "token"  # how the suite's own joins reach its Ray
    code, out = await canopy(runtime, "run", script(say("never")), "--user", scope.user_id, "--app", scope.app_id,
                             join_ray=True, unset=("RAY_AUTH_MODE",))
    assert code == 2, out
    assert re.search(r"canopy: cannot join the Ray cluster at \S+ \(CANOPY_RAY_ADDRESS\): .*set RAY_AUTH_MODE=token "
                     r"and give this machine the cluster's token", out), out
    assert "Traceback" not in out
    assert await rows(runtime.db, "SELECT 1 FROM sessions WHERE user_id = %s", scope.user_id) == []


async def test_operators_create_list_and_revoke_keys(api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    who = ["--user", scope.user_id, "--app", scope.app_id]
    code, out = await canopy(runtime, "keys", "create", *who, "--expires-in", "2h")
    assert code == 0, out
    api_key = out.strip().splitlines()[-1]
    async with client(api.url, api_key) as http:
        assert (await http.get("/api/v1/projects")).status_code == 200
    [row] = await rows(runtime.db, "SELECT key_id, expires_at - created_at AS life, last_used_at FROM api_keys "
                                   "WHERE user_id = %s", scope.user_id)
    assert row["life"] == datetime.timedelta(hours=2) and row["last_used_at"] is not None
    key_id = str(row["key_id"])

    code, out = await canopy(runtime, "keys", "list", *who)
    assert code == 0, out
    assert key_id in out and scope.user_id in out and "never" not in out.split(key_id)[1].splitlines()[0]
    assert api_key not in out  # never the key

    code, out = await canopy(runtime, "keys", "revoke", key_id)
    assert code == 0 and f"revoked {key_id}" in out, out
    async with client(api.url, api_key) as http:
        assert (await http.get("/api/v1/projects")).status_code == 401
    code, out = await canopy(runtime, "keys", "list", *who)
    assert code == 0 and "revoked" in out.split(key_id)[1].splitlines()[0], out

    unknown = str(uuid.uuid4())
    code, out = await canopy(runtime, "keys", "revoke", unknown)
    assert code == 1 and f"no API key {unknown}" in out, out
    code, out = await canopy(runtime, "keys", "create", *who, "--expires-in", "soon")
    assert code == 2 and "expires-in" in out, out
    assert len(await rows(runtime.db, "SELECT key_id FROM api_keys WHERE user_id = %s", scope.user_id)) == 1


def test_version_is_the_package_version() -> None:
    done = subprocess.run([sys.executable, "-m", "api.cli", "--version"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == f"canopy {importlib.metadata.version('canopy')}"


@pytest.mark.parametrize("command", [["up", "--data-dir", "{data}"], ["run", "hello"], ["keys", "list"]])
def test_a_data_dir_that_cannot_be_made_is_one_line_and_exit_code_2(tmp_path: Path, command: list[str]) -> None:
    """Under a regular file (or any path the process cannot make): one line naming the data dir,
    never a traceback, and nothing made, no server started."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    data = blocker / "data"
    env = clean_env(data, tmp_path / "ray")
    args = [part.format(data=data) for part in command]
    done = subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (f"canopy: the data dir {data} cannot be used: Not a directory ({data}); choose another "
                           "with --data-dir or CANOPY_DATA_DIR\n"), done.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]  # no Ray temp dir either


def _canopy_here(database_url: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command on the test database, without the test session's Ray: what it refuses needs none."""
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "CANOPY_RAY_ADDRESS")}
    env.update({"CANOPY_DATABASE_URL": database_url, "CANOPY_DATA_DIR": str(data_dir), "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _counts(database_url: str) -> tuple[int, ...]:
    """Rows of the tables the refused commands would write (the suite's own database: no other writer)."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute("SELECT (SELECT count(*) FROM api_keys), (SELECT count(*) FROM agents), "
                             "(SELECT count(*) FROM sessions)").fetchone()
    assert found is not None
    return tuple(found)


@pytest.mark.parametrize(("args", "says"), [
    (["keys", "create", "--expires-in", "200000000d"], "argument --expires-in: '200000000d' is longer than"),
    (["keys", "create", "--expires-in", "0.5"], "argument --expires-in: '0.5' is not a duration"),
    (["keys", "create", "--user", ""], "argument --user: '' is not a user or app id"),
    (["keys", "create", "--user", "someone\n"], "argument --user: 'someone\\n' is not a user or app id"),
    (["keys", "create", "--app", "a/b"], "argument --app: 'a/b' is not a user or app id"),
    (["keys", "create", "--user", "\N{DECIDUOUS TREE}"], "argument --user: '\N{DECIDUOUS TREE}' is not a user"),
    (["keys", "list", "--user", "a b"], "argument --user: 'a b' is not a user or app id"),
    (["sessions", "list", "--limit", "-1"], "argument --limit: -1: at least 1"),
    (["agents", "create", "bad id!"], "argument agent_id: 'bad id!' is not an agent id"),
    (["run", "hello", "--agent", "Bad"], "argument --agent: 'Bad' is not an agent id"),
    # A timeout of nan never came (no elapsed time exceeds it), nor one of inf; 0 or less at once.
    (["run", "hello", "--timeout", "nan"], "argument --timeout: 'nan' is not a timeout such as 600, 90s or 15m"),
    (["run", "hello", "--timeout", "inf"], "argument --timeout: 'inf' is not a timeout such as 600, 90s or 15m"),
    (["run", "hello", "--timeout", "0"], "argument --timeout: '0' is not a timeout such as 600, 90s or 15m"),
    (["run", "hello", "--timeout", "-5"], "argument --timeout: '-5' is not a timeout such as 600, 90s or 15m"),
    # 400 nines overflow a float to inf.
    (["run", "hello", "--timeout", "9" * 400], f"argument --timeout: '{'9' * 400}' is not a timeout such as 600"),
    (["tree", str(uuid.UUID(int=1)), "--trace", "/nonexistent/x.json"],
     "argument --trace: /nonexistent is not a directory"),
])
def test_a_bad_argument_is_one_line_and_exit_code_2_and_changes_nothing(
        database_url: str, tmp_path: Path, scope: Scope, args: list[str], says: str) -> None:
    """Each ended in a traceback (a CheckViolation, a negative LIMIT, a file that cannot be written)
    or made what the API refuses (a key for 548,000 years, an id the API's pattern rejects)."""
    ensure_schema(database_url)
    before = _counts(database_url)
    scoped = [*args, "--user", scope.user_id] if "--user" not in args and args[0] in ("keys", "agents") else args
    done = _canopy_here(database_url, tmp_path / "data", *scoped)
    assert done.returncode == 2, done
    assert says in done.stderr.strip().splitlines()[-1], done.stderr  # argparse's usage, then the error
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert _counts(database_url) == before and not Path("/nonexistent").exists()


def test_a_value_the_database_refuses_is_one_line_and_exit_code_2(database_url: str, tmp_path: Path,
                                                                   scope: Scope) -> None:
    ensure_schema(database_url)
    done = _canopy_here(database_url, tmp_path / "data", "sessions", "list", "--limit", str(10**20),
                        "--user", scope.user_id)
    assert done.returncode == 2, done
    assert done.stderr.strip() == "canopy: the database refused it: bigint out of range", done.stderr
