"""The operator commands (``canopy keys|agents|sessions|tree``) on the test database, and
``canopy run`` joining the test session's Ray cluster (CANOPY_RAY_ADDRESS) as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import ray

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence.records import Scope
from tests.api.conftest import ApiServer
from tests.api.helpers import client

REPO = Path(__file__).resolve().parents[2]


async def canopy(runtime: Runtime, *args: str, join_ray: bool = False, timeout: float = 120.0) -> tuple[int, str]:
    """Run the command; its exit code and its stdout (stderr, Ray's worker logs included, only on failure)."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
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


async def test_canopy_run_joins_the_cluster_and_prints_the_result(runtime: Runtime, scope: Scope) -> None:
    who = ["--user", scope.user_id, "--app", scope.app_id]
    task = script(call(create("helper", script(say("helped")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("result: ${1.results.0.output}"))
    code, out = await canopy(runtime, "run", task, *who, join_ray=True)
    assert code == 0, out
    assert out.rstrip().endswith("result: helped")
    assert "helper" in out and "slots" in out  # the live tree view
    code, out = await canopy(runtime, "run", script({"fail": "the provider is down"}), *who, join_ray=True)
    assert code == 1 and "failed" in out, out
