"""Fixtures of the sandbox conformance suite: one parametrised ``sandbox`` fixture, two backends.

Every test runs against ``local`` and ``docker``. Docker is skipped only when no engine
answers (``bash .ci/docker-up.sh`` starts one). The suite uses a database of its own on
the session's server, because the idle sweep is global: a tiny ``idle_seconds`` here must
never release another suite's sandboxes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from persistence import metrics
from persistence import sandbox_leases as leases
from persistence.databases import create_database, drop_database
from persistence.db import Database
from persistence.sandbox_leases import SandboxLease
from sandbox import workdirs
from sandbox.base import CommandResult, SandboxBackend, SandboxOptions, SandboxUnavailable
from sandbox.docker_backend import DockerBackend, connect
from sandbox.local_backend import LocalBackend
from sandbox.manager import SandboxManager

BACKENDS = ["local", "docker"]


@pytest.fixture(scope="session")
def sandbox_database_url(database_url: str) -> Iterator[str]:
    url = create_database(database_url, "canopy_sandbox")
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
async def sandbox_db(sandbox_database_url: str) -> AsyncIterator[Database]:
    database = await Database.connect(sandbox_database_url, max_size=12)
    yield database
    await database.close()


@pytest.fixture(scope="session")
def docker_backend_or_skip() -> Iterator[DockerBackend | None]:
    try:
        backend: DockerBackend | None = DockerBackend(connect())
    except SandboxUnavailable:
        backend = None
    yield backend
    if backend is not None:
        backend.close()


@dataclasses.dataclass
class SandboxKit:
    """A backend under test plus what the tests need around it."""

    kind: str
    backend: SandboxBackend
    make_backend: Callable[[], SandboxBackend]
    options: SandboxOptions
    db: Database
    root: Path
    trees: list[uuid.UUID] = dataclasses.field(default_factory=list)
    extra_backends: list[SandboxBackend] = dataclasses.field(default_factory=list)

    def new_backend(self) -> SandboxBackend:
        """A second backend object of the same kind, as a restarted runtime builds one."""
        backend = self.make_backend()
        self.extra_backends.append(backend)
        return backend

    def manager(self, idle_seconds: float = 300.0, backend: SandboxBackend | None = None) -> SandboxManager:
        return SandboxManager(self.db, backend or self.backend, idle_seconds, self.options)

    async def new_tree(self, workdir: Path | None = None, scope_of: uuid.UUID | None = None) \
            -> tuple[uuid.UUID, Path]:
        """A scope (or that of tree ``scope_of``), project and tree row (the lease's foreign key), and
        the project workdir."""
        tree_id, workdir = await new_tree(self.db, self.root, workdir, scope_of)
        self.trees.append(tree_id)
        return tree_id, workdir


async def new_tree(db: Database, root: Path, workdir: Path | None = None, scope_of: uuid.UUID | None = None) \
        -> tuple[uuid.UUID, Path]:
    """A scope (or that of tree ``scope_of``), project and tree row of this database (a lease needs its
    tree), and a project workdir under ``root`` unless one is given."""
    tree_id = uuid.uuid4()
    workdir = workdir or root / f"project-{tree_id.hex[:8]}"
    workdir.mkdir(parents=True, exist_ok=True)
    user, app, project_id = f"user-{tree_id.hex[:8]}", "sandbox-tests", uuid.uuid4()
    async with db.tx() as conn:
        if scope_of is None:
            await conn.execute("INSERT INTO scopes (user_id, app_id) VALUES (%s, %s)", (user, app))
        else:
            cur = await conn.execute("SELECT user_id, app_id FROM trees WHERE tree_id = %s", (scope_of,))
            row = await cur.fetchone()
            assert row is not None
            user, app = row["user_id"], row["app_id"]
        await conn.execute(
            "INSERT INTO projects (project_id, user_id, app_id, name, workdir) "
            "VALUES (%s, %s, %s, %s, %s)",
            (project_id, user, app, "p", str(workdir)),
        )
        await conn.execute(
            "INSERT INTO trees (tree_id, user_id, app_id, project_id, slot_limit, lineage_id, spawn_chain) "
            "VALUES (%s, %s, %s, %s, 4, %s, ARRAY[%s]::uuid[])",
            (tree_id, user, app, project_id, tree_id, tree_id),
        )
    return tree_id, workdir


async def insert_running_run(kit: SandboxKit, tree: uuid.UUID) -> uuid.UUID:
    """The root session of the tree with one Turn and one Run in ``running`` (plain SQL)."""
    input_id, turn_id, run_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with kit.db.tx() as conn:
        cur = await conn.execute("SELECT user_id, app_id, project_id FROM trees WHERE tree_id = %s", (tree,))
        row = await cur.fetchone()
        assert row is not None
        scope = (row["user_id"], row["app_id"])
        await conn.execute(
            "INSERT INTO sessions (session_id, tree_id, user_id, app_id, project_id, name, path, depth, "
            "agent_config) VALUES (%s, %s, %s, %s, %s, 'root', '/root', 0, '{}')",
            (tree, tree, *scope, row["project_id"]),
        )
        await conn.execute(
            "INSERT INTO inputs (input_id, session_id, user_id, app_id, text, status, origin) "
            "VALUES (%s, %s, %s, %s, 'work', 'consumed', '{}')",
            (input_id, tree, *scope),
        )
        await conn.execute(
            "INSERT INTO turns (turn_id, session_id, input_id) VALUES (%s, %s, %s)", (turn_id, tree, input_id)
        )
        await conn.execute(
            "INSERT INTO runs (run_id, turn_id, session_id, tree_id, kind, status, started_at) "
            "VALUES (%s, %s, %s, %s, 'start', 'running', now())",
            (run_id, turn_id, tree, tree),
        )
    return run_id


async def lease_of(kit: SandboxKit, tree: uuid.UUID) -> SandboxLease:
    """The tree's sandbox lease, which must exist."""
    async with kit.db.tx() as conn:
        lease = await leases.get(conn, tree)
    assert lease is not None
    return lease


async def last_used(kit: SandboxKit, tree: uuid.UUID, seconds_ago: float) -> None:
    """Date the tree's sandbox lease's last use ``seconds_ago`` (plain SQL)."""
    async with kit.db.tx() as conn:
        await conn.execute(
            "UPDATE sandbox_leases SET last_used_at = now() - make_interval(secs => %s) WHERE tree_id = %s",
            (seconds_ago, tree),
        )


async def made_room(kit: SandboxKit, limit: str) -> float:
    """``canopy_sandboxes_made_room{limit}`` in the counters table, once this process's counts are in."""
    await metrics.flush(kit.db)
    async with kit.db.tx() as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(value), 0) AS n FROM metric_counters WHERE name = %s AND labels = %s",
            (metrics.SANDBOXES_MADE_ROOM.name, Jsonb({"limit": limit})),
        )
        row = await cur.fetchone()
    assert row is not None
    return float(row["n"])


def sandbox_options() -> SandboxOptions:
    """Small limits; a container limit no other engineer's or suite's containers on a shared engine reach
    (the limit has tests of its own)."""
    image = os.environ.get("CANOPY_SANDBOX_IMAGE", "canopy-sandbox:latest")
    return SandboxOptions(image=image, memory="256m", cpus=1.0, pids=256, tmp_size="64m", max_containers=100_000)


@pytest.fixture(params=BACKENDS)
async def sandbox(
    request: pytest.FixtureRequest,
    sandbox_db: Database,
    docker_backend_or_skip: DockerBackend | None,
    tmp_path: Path,
) -> AsyncIterator[SandboxKit]:
    kind: str = request.param
    if kind == "docker":
        if docker_backend_or_skip is None:
            pytest.skip("no Docker engine answers (start one with: bash .ci/docker-up.sh)")
        docker_backend = docker_backend_or_skip
        kit = SandboxKit(kind, docker_backend, DockerBackend, sandbox_options(), sandbox_db, tmp_path)
    else:
        state_root = tmp_path / "local-sandboxes"
        kit = SandboxKit(
            kind,
            LocalBackend(state_root),
            lambda: LocalBackend(state_root),
            sandbox_options(),
            sandbox_db,
            tmp_path,
        )
    yield kit
    await cleanup_kit(kit)


@pytest.fixture
def disks(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, whose workdirs' disk images (sandbox/workdirs.py) are unmounted after the test.
    Ask for it before ``sandbox``: its containers, which bind the workdirs, go first."""
    if os.geteuid() != 0:
        pytest.skip("a workdir's disk is a loop mount, which needs root")
    yield tmp_path
    for point in sorted(mounts_under(tmp_path), key=lambda point: len(point.parts), reverse=True):
        workdirs.unmount(point)


def mounts_under(root: Path) -> list[Path]:
    """The mount points under ``root``, as this process's mount table lists them."""
    points = (Path(line.split()[4].encode().decode("unicode_escape"))
              for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return [point for point in points if point.is_relative_to(root)]


@pytest.fixture
async def docker_kit(
    sandbox_db: Database, docker_backend_or_skip: DockerBackend | None, tmp_path: Path
) -> AsyncIterator[SandboxKit]:
    """The Docker backend alone, for tests of what only a container does."""
    if docker_backend_or_skip is None:
        pytest.skip("no Docker engine answers (start one with: bash .ci/docker-up.sh)")
    kit = SandboxKit("docker", docker_backend_or_skip, DockerBackend, sandbox_options(), sandbox_db, tmp_path)
    yield kit
    await cleanup_kit(kit)


async def cleanup_kit(kit: SandboxKit) -> None:
    # Whatever a test left behind: containers by label, local sandbox dirs by tree id, and
    # active leases (the sweep is global: the next test's sweep must not see this test's trees).
    async with kit.db.tx() as conn:
        await conn.execute(
            "UPDATE sandbox_leases SET state = 'released', handle = NULL WHERE tree_id = ANY(%s)",
            (kit.trees,),
        )
    for tree_id in kit.trees:
        if isinstance(kit.backend, DockerBackend):
            for container_id in kit.backend.containers_for(tree_id):
                await kit.backend.release(container_id)
        elif isinstance(kit.backend, LocalBackend):
            await kit.backend.release(str(kit.backend.state_root / str(tree_id)))
    if isinstance(kit.backend, LocalBackend):
        shutil.rmtree(kit.backend.state_root, ignore_errors=True)
    for backend in kit.extra_backends:
        backend.close()


class GatedBackend:
    """The real backend, with ``ensure`` (after it built the sandbox, before the manager records it)
    or ``release`` (before it removes anything) held at a gate, so that a test can act mid-way."""

    def __init__(self, inner: SandboxBackend, gated: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.gated = gated
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.calls: collections.Counter[str] = collections.Counter()
        self.finished_at: float | None = None

    async def _hold(self, step: str) -> None:
        self.calls[step] += 1
        if step == self.gated:
            self.entered.set()
            await self.gate.wait()

    async def ensure(self, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> str:
        handle = await self.inner.ensure(tree_id, workdir, options)
        await self._hold("ensure")
        return handle

    async def release(self, handle: str) -> None:
        await self._hold("release")
        await self.inner.release(handle)
        self.finished_at = time.monotonic()

    async def run(self, handle: str, command: str, timeout_seconds: float, command_id: str) -> CommandResult:
        return await self.inner.run(handle, command, timeout_seconds, command_id)

    async def kill(self, handle: str, command_id: str) -> bool:
        return await self.inner.kill(handle, command_id)

    async def exists(self, handle: str) -> bool:
        return await self.inner.exists(handle)

    async def fits(self, handle: str, tree_id: uuid.UUID, workdir: Path, options: SandboxOptions) -> bool:
        return await self.inner.fits(handle, tree_id, workdir, options)

    async def sandboxes(self) -> dict[str, uuid.UUID]:
        return await self.inner.sandboxes()

    async def remove_leftovers(self) -> int:
        return await self.inner.remove_leftovers()

    def close(self) -> None:
        self.inner.close()


async def open_transactions(db: Database, older_than: float = 0.25) -> list[dict[str, object]]:
    """Every other session of the database inside a transaction that began more than ``older_than``
    seconds ago (held, not a claim's brief look at its lease), with whether it holds a lock on
    ``sandbox_leases`` (a row lock keeps one on its table until the transaction ends)."""
    async with db.tx() as conn:
        cur = await conn.execute(
            "SELECT a.pid, a.state, a.query, EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid "
            "AND l.relation = 'sandbox_leases'::regclass) AS holds_lease_lock "
            "FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
            "AND a.xact_start < clock_timestamp() - make_interval(secs => %s)",
            (older_than,),
        )
        return list(await cur.fetchall())
