"""Shared fixtures: one real PostgreSQL database per test process, a fresh scope per test, and
one real local Ray per session shape with the Canopy runtime on that database (shared by the
actor, API and browser tests).

The database is ``CANOPY_DATABASE_URL`` when set (a new database is created in that
server), else the embedded server started in a temporary data directory.

The suite runs in two pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml): the
tests are mostly waits on scripted model latency, sandboxes and Ray, so two processes on two
cores finish in a little over half the time. Each worker has its own database server and its
own Rays. Every test that uses ``runtime`` is grouped by its shape (``xdist_group``), so each
shape's tests run in one worker, one after another, on one Ray started once; the tests that
need no runtime (persistence, sandbox backends, the multi-node scenarios and ``canopy up``,
which start Rays of their own) fill in around them.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import ray

from actors.runtime import Runtime
from persistence import sandbox_leases
from persistence.databases import create_database, drop_database
from persistence.db import Database
from persistence.embedded import embedded_url, stop_embedded
from persistence.records import Scope
from persistence.settings import Settings, get_settings
from sandbox.manager import SandboxManager
from tests.actors.replay_server import ReplayServer
from tests.ports import free_port

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Ray's log monitor lists each node's log directory every 0.1 s until it holds 1,000 files: the
# suite's Rays start hundreds of worker processes (two log files each), and their monitors took ~5 %
# of CI's CPU. Listed every 2 s, a new worker's first lines reach its driver up to 2 s later, which
# no test reads (every Ray the suite starts, in this process or a subprocess, inherits these).
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "2")
# The offline busybox image .ci/docker-up.sh builds; canopy up's default (sandbox/images.py) is not built in CI.
os.environ.setdefault("CANOPY_SANDBOX_IMAGE", "canopy-sandbox:latest")
# A workdir's disk quota is a loop mount per workdir, which outlives the test that made it: the tests
# of the quota (tests/sandbox/test_workdirs.py) turn it on and unmount what they mounted.
os.environ.setdefault("CANOPY_SANDBOX_WORKDIR_MB", "0")


# The replay server's port is fixed for the test process, so the runtimes can list its endpoint
# among those an agent's api_base may be (with a key only a listed endpoint gets), as an operator
# lists theirs. From the process's own slice of ports (tests/ports.py): nothing else binds it.
REPLAY_PORT = free_port()
# http://127.0.0.1:9 (discard) refuses every connection: an endpoint agents may name that is never there.
AGENT_API_BASES = [f"http://127.0.0.1:{REPLAY_PORT}/v1", "http://127.0.0.1:9/v1"]


@pytest.fixture(scope="session")
def replay() -> Iterator[ReplayServer]:
    """An OpenAI-compatible server of the tests' own (tests/actors/replay_server.py), one per test
    process; each test scripts the model names it uses."""
    server = ReplayServer().start(REPLAY_PORT)
    yield server
    server.stop()


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


@pytest.fixture
def own_database_url(database_url: str) -> Iterator[str]:
    """A database of the test's own on the suite's server, for a deployment the test starts beside
    the suite's runtimes (a scenario's Ray cluster): deployments sharing a database work each
    other's sessions (every sweeper re-activates what the rows say is due), so where a tree ran
    would be another deployment's doing, and a deployment shut down takes its unflushed counts."""
    url = create_database(database_url, "canopy_own")
    yield url
    drop_database(url)


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
    "CANOPY_AGENT_API_BASES": json.dumps(AGENT_API_BASES),
    "CANOPY_LEASE_SECONDS": "4",
    "CANOPY_HEARTBEAT_SECONDS": "1",
    "CANOPY_SWEEP_SECONDS": "0.5",
    # Tests read what the scripted model was sent (tests/actors/test_runtime.py, tests/hostile).
    "CANOPY_SCRIPTED_REQUEST_LOG": "true",
    "CANOPY_ACTOR_IDLE_SECONDS": "6",
    # A host that moves (tests/actors/test_placement.py asks one to) gives up draining soon.
    "CANOPY_HOST_DRAIN_SECONDS": "3",
    "CANOPY_FAILPOINTS": "before_model_call=3,after_model_commit=3,after_command_receipt=3,during_compaction=3",
    # The multi-node scenarios (a node lost, a node joined) need not wait 10 s for the sweeper to look.
    "CANOPY_NODE_WATCH_SECONDS": "2",
    # Many trees run commands in one session: idle sandboxes go soon, and the engine-wide container
    # limit leaves room for the other suites sharing the engine (tests/hostile tests the limit itself).
    "CANOPY_SANDBOX_IDLE_SECONDS": "20",
    "CANOPY_SANDBOX_MAX_CONTAINERS": "200",
    # tests/actors/test_compaction.py queues a 300-Turn conversation at once (the limit has tests of its own).
    "CANOPY_MAX_PENDING_INPUTS": "300",
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


# Ray's metrics agent exports every 10 s by default; the metrics tests, which read a runtime's export,
# need not wait that long. Set while a runtime's Ray starts only: its processes keep it, and the Rays
# of the scenarios and canopy runs (which inherit the suite's environment) export at Ray's default.
RUNTIME_RAY_ENV = {"RAY_metrics_report_interval_ms": "2000"}


# The two placements of actors/placement.py, as the environment of a runtime (and its Ray) sets them.
SHAPES = {"dedicated": {"CANOPY_SESSION_HOSTS": "0"}, "hosted": {"CANOPY_SESSION_HOSTS": "2"}}
DEFAULT_SHAPE = "hosted"  # what canopy up runs (Settings.session_hosts defaults to 2)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every actor test that uses ``runtime`` runs against both placements, like a conformance
    suite; every other test that uses it runs on the default shape's runtime — the same Ray as
    the actor tests of that shape, not a third one. So does an actor test marked ``default_shape``:
    one whose behaviour the shapes do not decide (where a session runs is the shapes' difference).

    A test marked ``session_kills`` kills a session's process (its ``how``): the default shape's by
    ``ray.kill`` and by ``kill -9``, the other's by ``kill -9`` alone. ``ray.kill`` ends the actor
    for good (the next hint makes a new one), ``kill -9`` has Ray restart it in place; either way
    the Run's process is gone and its lease runs out, whichever shape's process it was, and a
    dedicated actor is ended by ``ray.kill`` every time it passivates (and in
    test_kill_member_mid_turn)."""
    if "runtime" not in metafunc.fixturenames:
        return
    actors = Path(__file__).parent / "actors"
    both = metafunc.definition.path.is_relative_to(actors) and not metafunc.definition.get_closest_marker(
        "default_shape")
    shapes = list(SHAPES) if both else [DEFAULT_SHAPE]
    if metafunc.definition.get_closest_marker("session_kills"):
        kills = [(shape, how) for shape in shapes
                 for how in (("ray.kill", "kill -9") if shape == DEFAULT_SHAPE else ("kill -9",))]
        metafunc.parametrize(("runtime", "how"), kills, indirect=["runtime"], scope="session")
    else:
        metafunc.parametrize("runtime", shapes, indirect=True, scope="session")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (shape := _runtime_shape(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(f"runtime-{shape}"))


def _runtime_shape(item: pytest.Item | None) -> str | None:
    """The shape of the runtime ``item`` runs on (``pytest_generate_tests``), or None."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("runtime") if callspec is not None else None


@pytest.hookimpl(trylast=True)  # after the item's own teardown
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Under xdist's loadgroup, a shape's runtime is closed once its worker has run the last of its
    tests (a group that xdist sends whole, run one after another), not at the session's end: an idle runtime's Ray
    and actors took ~18 % of a core, and the worker that ran the dedicated group went on for twenty
    minutes with that Ray idle beside it. The fixture's own finish, as pytest calls it when the
    next test asks for the other shape (pytest < 9, pinned in pyproject.toml). Not otherwise (one
    process, ``-n 0``, or another distribution), where tests of a shape need not be next to each
    other: the runtime would restart. xdist's worker notes loadgroup in its options."""
    shape = _runtime_shape(item)
    if shape is not None and _runtime_shape(nextitem) != shape and getattr(item.config.option, "loadgroup", False):
        item._fixtureinfo.name2fixturedefs["runtime"][-1].finish(item._request)


@pytest.fixture(scope="session")
async def runtime(request: pytest.FixtureRequest, database_url: str, data_dir: Path) -> AsyncIterator[Runtime]:
    """The runtime of one shape (``pytest_generate_tests``): each shape starts a Ray of its own
    with the shape in its environment, and runs all of its tests before the other's."""
    shape = SHAPES[request.param]
    saved = {name: os.environ.get(name) for name in shape}
    os.environ.update({**RUNTIME_ENV, **shape})
    os.environ["CANOPY_DATABASE_URL"] = database_url
    os.environ["CANOPY_DATA_DIR"] = str(data_dir)
    # No routes of its own; tests/actors/test_providers.py rewrites it and the gateway reloads it.
    (data_dir / "models.yaml").write_text("model_list: []\n")
    os.environ["CANOPY_MODELS_FILE"] = str(data_dir / "models.yaml")
    get_settings.cache_clear()  # this process's settings follow the shape too
    os.environ.update(RUNTIME_RAY_ENV)
    try:
        rt = await Runtime.start(Settings(), num_cpus=2, include_dashboard=True)
    finally:
        for name in RUNTIME_RAY_ENV:
            del os.environ[name]
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
