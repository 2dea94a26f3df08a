"""Fixtures of the sandbox conformance suite: one parametrised ``sandbox`` fixture, two backends.

Every test runs against ``local`` and ``docker``. Docker is skipped only when no engine
answers (``bash .ci/docker-up.sh`` starts one). The suite uses a database of its own on
the session's server, because the idle sweep is global: a tiny ``idle_seconds`` here must
never release another suite's sandboxes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from persistence.databases import create_database, drop_database
from persistence.db import Database
from sandbox.base import SandboxBackend, SandboxOptions
from sandbox.docker_backend import DockerBackend
from sandbox.local_backend import LocalBackend
from sandbox.manager import SandboxManager, docker_client_if_answering

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
    client = docker_client_if_answering()
    backend = DockerBackend(client) if client is not None else None
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

    async def new_tree(self, workdir: Path | None = None) -> tuple[uuid.UUID, Path]:
        """A scope, project and tree row (the lease's foreign key), and the project workdir."""
        tree_id = uuid.uuid4()
        workdir = workdir or self.root / f"project-{tree_id.hex[:8]}"
        workdir.mkdir(parents=True, exist_ok=True)
        user, app, project_id = f"user-{tree_id.hex[:8]}", "sandbox-tests", uuid.uuid4()
        async with self.db.tx() as conn:
            await conn.execute("INSERT INTO scopes (user_id, app_id) VALUES (%s, %s)", (user, app))
            await conn.execute(
                "INSERT INTO projects (project_id, user_id, app_id, name, workdir) "
                "VALUES (%s, %s, %s, %s, %s)",
                (project_id, user, app, "p", str(workdir)),
            )
            await conn.execute(
                "INSERT INTO trees (tree_id, user_id, app_id, project_id, slot_limit) "
                "VALUES (%s, %s, %s, %s, 4)",
                (tree_id, user, app, project_id),
            )
        self.trees.append(tree_id)
        return tree_id, workdir


def _sandbox_options() -> SandboxOptions:
    image = os.environ.get("CANOPY_SANDBOX_IMAGE", "canopy-sandbox:latest")
    return SandboxOptions(image=image, memory="256m", cpus=1.0, pids=256)


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
        kit = SandboxKit(kind, docker_backend, DockerBackend, _sandbox_options(), sandbox_db, tmp_path)
    else:
        state_root = tmp_path / "local-sandboxes"
        kit = SandboxKit(
            kind,
            LocalBackend(state_root),
            lambda: LocalBackend(state_root),
            _sandbox_options(),
            sandbox_db,
            tmp_path,
        )
    yield kit
    await _cleanup(kit)


async def _cleanup(kit: SandboxKit) -> None:
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
