"""Helpers for the API tests: clients with a scope's key, the app on Ray Serve, SSE parsing, scripts,
database reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from ray import serve

from actors.runtime import Runtime, worker_env
from api.up import LOOPBACK, start_serve
from tests.actors.helpers import eventually, rows  # noqa: F401  (re-exported)
from tests.ports import free_port

ADMIN_TOKEN = "test-admin-token"
METRICS_TOKEN = "test-metrics-token"


@contextlib.asynccontextmanager
async def served(runtime: Runtime, admin_token: str) -> AsyncIterator[str]:
    """The app deployed on Ray Serve as ``canopy up`` deploys it, in the test session's own Ray
    cluster on a free loopback port; yields its base URL and shuts Serve down after."""
    port = free_port()
    # The replicas read the admin token from the runtime's secrets directory, as canopy up's do.
    settings = runtime.settings.model_copy(update={"admin_token": SecretStr(admin_token)})
    env = worker_env(settings, runtime.database_url)
    await asyncio.to_thread(start_serve, env, LOOPBACK, port)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        await asyncio.to_thread(serve.shutdown)


def client(base_url: str, api_key: str | None, timeout: float = 30.0) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)


async def sse_frames(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Parse a text/event-stream body into frames {id, event, data, comment}."""
    frame: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line == "":
            if frame:
                yield frame
            frame = {}
            continue
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            frame["data"] = (frame["data"] + "\n" + value) if "data" in frame else value
        else:
            frame[field] = value


async def collect_events(http: httpx.AsyncClient, path: str, *, until: Callable[[dict[str, Any]], bool],
                         headers: dict[str, str] | None = None, timeout: float = 60.0,
                         params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Read durable events (frames with an id) from an SSE stream until ``until(event)`` is true."""
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async with http.stream("GET", path, headers=headers, params=params) as response:
            assert response.status_code == 200, await response.aread()
            async for frame in sse_frames(response):
                if "id" not in frame:
                    continue
                event = json.loads(frame["data"])
                assert str(event["cursor"]) == frame["id"]
                seen.append(event)
                if until(event):
                    return

    await asyncio.wait_for(read(), timeout)
    return seen


async def terminal(http: httpx.AsyncClient, input_id: str) -> bool:
    """Has this input's work ended (its Turn, or the input itself when cancelled)?"""
    return bool((await http.get(f"/api/v1/inputs/{input_id}/result")).json()["terminal"])


async def poll(check: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    return await eventually(check, timeout=timeout, every=0.1)


def clean_env(data_dir: Path, ray_dir: Path) -> dict[str, str]:
    """The environment of a ``canopy`` command run as a user would: no test settings and no pointer
    to the test's own Ray cluster (``canopy up`` starts its own, with its Ray session under
    ``ray_dir``), nor the variable that keeps Ray quiet about its token."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("CANOPY_") and key not in ("RAY_ADDRESS", "RAY_NAMESPACE", "RAY_AUTH_MODE")}
    env.update({"CANOPY_DATA_DIR": str(data_dir), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": str(ray_dir),
                "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"})
    return env


def seq_scans(plan: dict[str, Any]) -> list[str]:
    """The relations a plan (``EXPLAIN (FORMAT JSON)``'s ``Plan``) reads with a sequential scan."""
    found = [plan.get("Relation Name", "?")] if plan.get("Node Type") == "Seq Scan" else []
    for child in plan.get("Plans", []):
        found += seq_scans(child)
    return found
