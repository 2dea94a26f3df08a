"""Shared fixtures: one real PostgreSQL database per test run, a fresh scope per test, and one
real local Ray with the Canopy runtime on that database (shared by the actor and API tests).

The database is ``CANOPY_DATABASE_URL`` when set (a new database is created in that
server), else the embedded server started in a temporary data directory.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import ray

from actors.runtime import Runtime
from persistence import sandbox_leases
from persistence.databases import create_database
from persistence.db import Database
from persistence.embedded import embedded_url, stop_embedded
from persistence.records import Scope
from persistence.settings import Settings, get_settings
from sandbox.manager import SandboxManager

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# The offline busybox image .ci/docker-up.sh builds; canopy up's default (sandbox/images.py) is not built in CI.
os.environ.setdefault("CANOPY_SANDBOX_IMAGE", "canopy-sandbox:latest")


@pytest.fixture(scope="session")
def data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="canopy-test-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def database_url(data_dir: Path) -> Iterator[str]:
    external = os.environ.get("CANOPY_DATABASE_URL")
    url = create_database(external or embedded_url(data_dir), "canopy_test")
    yield url
    if not external:
        stop_embedded(data_dir)


@pytest.fixture(scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await Database.connect(database_url, max_size=8)
    yield database
    await database.close()


@pytest.fixture
def scope() -> Scope:
    """A scope of its own for every test, so tests never see each other's rows."""
    return Scope(f"user-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}")


# Short leases and sweeps so that kill tests recover in seconds, not minutes.
RUNTIME_ENV = {
    "CANOPY_LEASE_SECONDS": "4",
    "CANOPY_HEARTBEAT_SECONDS": "1",
    "CANOPY_SWEEP_SECONDS": "0.5",
    "CANOPY_ACTOR_IDLE_SECONDS": "6",
    "CANOPY_FAILPOINTS": "before_model_call=3,after_model_commit=3,after_command_receipt=3,during_compaction=3",
    # Ray's metrics agent exports every 10 s by default; the metrics test need not wait that long.
    "RAY_metrics_report_interval_ms": "2000",
    # Many trees run commands in one session: idle sandboxes go soon, and the engine-wide container
    # limit leaves room for the other suites sharing the engine (tests/hostile tests the limit itself).
    "CANOPY_SANDBOX_IDLE_SECONDS": "20",
    "CANOPY_SANDBOX_MAX_CONTAINERS": "200",
    # A provider key the runtime must move out of every environment into the secrets directory; only
    # the model gateway reads it (tests/actors/test_providers.py looks for it everywhere else).
    "OPENAI_API_KEY": "sk-canopy-test-7c1e0f3b9a4d4e2f8b6a5d0c1e2f3a4b",
}


async def _remove_sandboxes(database_url: str) -> None:
    """The containers this session's trees made: gone with the session (the engine outlives it)."""
    db = await Database.connect(database_url, max_size=1)
    manager = await asyncio.to_thread(SandboxManager.from_settings, db)
    try:
        for handle, tree_id in (await manager.backend.sandboxes()).items():
            async with db.tx() as conn:
                ours = await sandbox_leases.tree_known(conn, tree_id)
            if ours:
                await manager.backend.release(handle)
    finally:
        manager.close()
        await db.close()


# The two placements of actors/placement.py, as the environment of a runtime (and its Ray) sets them.
SHAPES = {"dedicated": {"CANOPY_SESSION_HOSTS": "0"}, "hosted": {"CANOPY_SESSION_HOSTS": "2"}}


@pytest.fixture(scope="session")
async def runtime(request: pytest.FixtureRequest, database_url: str, data_dir: Path) -> AsyncIterator[Runtime]:
    """The runtime on this test session's Ray. tests/actors runs every test that uses it once per
    shape (``SHAPES``, see tests/actors/conftest.py): each shape starts a Ray of its own with the
    shape in its environment, and pytest runs all of one shape's tests before the other's. The
    other suites run on the default shape."""
    shape = SHAPES.get(getattr(request, "param", ""), {})
    saved = {name: os.environ.get(name) for name in shape}
    os.environ.update({**RUNTIME_ENV, **shape})
    os.environ["CANOPY_DATABASE_URL"] = database_url
    os.environ["CANOPY_DATA_DIR"] = str(data_dir)
    # No routes of its own; tests/actors/test_providers.py rewrites it and the gateway reloads it.
    (data_dir / "models.yaml").write_text("model_list: []\n")
    os.environ["CANOPY_MODELS_FILE"] = str(data_dir / "models.yaml")
    get_settings.cache_clear()  # this process's settings follow the shape too
    rt = await Runtime.start(Settings(), num_cpus=2, include_dashboard=True)
    yield rt
    await rt.close()
    ray.shutdown()
    await _remove_sandboxes(database_url)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    get_settings.cache_clear()
