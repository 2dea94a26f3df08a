"""Per-tree sandbox lifecycle: claim, use, idle release — with the lease in PostgreSQL.

- ``claim`` returns the tree's sandbox handle, creating the sandbox on first use and
  re-adopting it after a restart (the lease row names it and the backend finds it). It
  runs under the lease row lock, so two claims never create two sandboxes, and a claim
  that arrives during a release waits until the release has committed, then builds a
  fresh sandbox.
- ``release_idle`` is the sweep: a tree whose sandbox is unused for ``idle_seconds`` and
  that has no Run in ``running`` is released — processes and ``/tmp`` go, the workdir
  stays. Each tree is handled in its own transaction; one failure is logged and skipped.
- A Run ending never releases anything; only the sweep (or an explicit ``release``) does.
- ``reap_orphans`` removes sandboxes no lease names: made by a claim whose transaction
  never committed (its process died between creating the container and the commit) for a
  tree that never claimed again. Only trees of this database are touched: an engine may
  serve several deployments, and another's sandboxes are not ours to judge.

Only the lease row is locked while a release is in flight, so every other write of the
tree — messages, runs, the ``trees`` row — keeps committing (SPEC §12).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors

from persistence import sandbox_leases as leases
from persistence.db import Connection, Database
from persistence.sandbox_leases import SandboxLease
from persistence.settings import Settings, get_settings
from sandbox.base import (
    DEFAULT_TIMEOUT_SECONDS,
    CommandResult,
    SandboxBackend,
    SandboxError,
    SandboxGone,
    SandboxOptions,
)
from sandbox.docker_backend import DockerBackend
from sandbox.local_backend import LocalBackend

log = logging.getLogger(__name__)

_PING_TIMEOUT_SECONDS = 3
# A release holds the lease row lock (claims of the tree wait): it must not hang forever.
_RELEASE_TIMEOUT_SECONDS = 120.0


class SandboxManager:
    def __init__(
        self,
        db: Database,
        backend: SandboxBackend,
        idle_seconds: float | None = None,
        options: SandboxOptions | None = None,
    ) -> None:
        self.db = db
        self.backend = backend
        self.idle_seconds = idle_seconds if idle_seconds is not None else get_settings().sandbox_idle_seconds
        self.options = options or options_from_settings(get_settings())
        # Commands this process is running, per tree: the sweep never releases under them,
        # even for callers that have no Run (the runs table is the cross-process guard).
        self._in_flight: collections.Counter[uuid.UUID] = collections.Counter()

    @classmethod
    def from_settings(cls, db: Database, settings: Settings | None = None) -> SandboxManager:
        settings = settings or get_settings()
        return cls(
            db, choose_backend(settings), settings.sandbox_idle_seconds, options_from_settings(settings)
        )

    # -- use -------------------------------------------------------------------------

    async def claim(self, tree_id: uuid.UUID, workdir: Path) -> str:
        """The tree's sandbox handle: existing, re-adopted, or new. Waits out an in-flight release."""
        async with self.db.tx() as conn:
            lease = await leases.lock(conn, tree_id, self.backend.name)
            if await self._reusable(lease):
                await leases.touch(conn, tree_id)
                assert lease.handle is not None
                return lease.handle
            handle = await self.backend.ensure(tree_id, workdir, self.options)
            await leases.activate(conn, tree_id, self.backend.name, handle)
            return handle

    async def _reusable(self, lease: SandboxLease) -> bool:
        if lease.state != "active" or lease.handle is None:
            return False
        if lease.backend != self.backend.name:
            log.warning(
                "tree %s has a %s sandbox but this runtime uses %s; making a new one",
                lease.tree_id,
                lease.backend,
                self.backend.name,
            )
            return False
        return await self.backend.exists(lease.handle)

    async def touch(self, tree_id: uuid.UUID) -> bool:
        """Mark the tree's sandbox as used now; False if the tree has no active sandbox."""
        async with self.db.tx() as conn:
            return await leases.touch(conn, tree_id)

    async def run_command(
        self,
        tree_id: uuid.UUID,
        workdir: Path,
        command: str,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> CommandResult:
        """Claim the tree's sandbox and run one command in it (cancel the task to kill it)."""
        with self._using(tree_id):
            handle = await self.claim(tree_id, workdir)
            try:
                result = await self.backend.run(handle, command, timeout_seconds)
            except SandboxGone:
                # It vanished between claim and start (nothing ran): claim builds a new one.
                log.warning("sandbox of tree %s vanished; claiming it again", tree_id)
                handle = await self.claim(tree_id, workdir)
                result = await self.backend.run(handle, command, timeout_seconds)
            await self.touch(tree_id)
            return result

    @contextlib.contextmanager
    def _using(self, tree_id: uuid.UUID) -> Iterator[None]:
        self._in_flight[tree_id] += 1
        try:
            yield
        finally:
            self._in_flight[tree_id] -= 1
            if not self._in_flight[tree_id]:
                del self._in_flight[tree_id]

    # -- release ---------------------------------------------------------------------

    async def release_idle(self, now: datetime.datetime | None = None) -> list[uuid.UUID]:
        """Release every sandbox idle for ``idle_seconds`` before ``now`` (DB clock if None).

        Returns the trees released. Trees with a running Run, a command in flight here,
        or a claim in progress are skipped; a failing tree is logged and skipped.
        """
        async with self.db.tx() as conn:
            candidates = await leases.idle_trees(conn, self.idle_seconds, now)
        released = []
        for tree_id in candidates:
            if self._in_flight[tree_id]:
                continue
            try:
                if await self._release_if_idle(tree_id, now):
                    released.append(tree_id)
            except Exception:
                log.exception("idle release of the sandbox of tree %s failed; skipped", tree_id)
        return released

    async def _release_if_idle(self, tree_id: uuid.UUID, now: datetime.datetime | None) -> bool:
        async with self.db.tx() as conn:
            lease = await leases.lock_if_idle(conn, tree_id, self.idle_seconds, now)
            if lease is None or await leases.tree_has_running_run(conn, tree_id):
                return False
            await self._release_locked(conn, lease)
            return True

    async def release(self, tree_id: uuid.UUID) -> bool:
        """Release the tree's sandbox now, unless a Run of the tree is running. True if released."""
        async with self.db.tx() as conn:
            lease = await leases.lock(conn, tree_id, self.backend.name)
            if lease.state != "active" or await leases.tree_has_running_run(conn, tree_id):
                return False
            await self._release_locked(conn, lease)
            return True

    async def _release_locked(self, conn: Connection, lease: SandboxLease) -> None:
        # Runs inside the transaction that holds the lease row lock: claims wait for it.
        if lease.handle is not None and lease.backend == self.backend.name:
            await asyncio.wait_for(self.backend.release(lease.handle), _RELEASE_TIMEOUT_SECONDS)
        elif lease.handle is not None:
            log.warning(
                "tree %s: cannot release a %s sandbox from a %s runtime; forgetting it",
                lease.tree_id,
                lease.backend,
                self.backend.name,
            )
        await leases.mark_released(conn, lease.tree_id)
        log.info("released the sandbox of tree %s", lease.tree_id)

    async def reap_orphans(self) -> list[str]:
        """Release every sandbox of this database's trees that no active lease names.

        Each sandbox is judged under its tree's lease row lock: a claim creating a sandbox
        holds that lock until its lease commits, so a sandbox being born is never taken
        for an orphan. Returns the handles released; a failing one is logged and skipped.
        """
        reaped = []
        for handle, tree_id in (await self.backend.sandboxes()).items():
            try:
                if await self._reap_if_orphan(handle, tree_id):
                    reaped.append(handle)
            except Exception:
                log.exception("reaping sandbox %s of tree %s failed; skipped", handle, tree_id)
        return reaped

    async def _reap_if_orphan(self, handle: str, tree_id: uuid.UUID) -> bool:
        async with self.db.tx() as conn:
            if not await leases.tree_known(conn, tree_id):
                return False
            lease = await leases.lock(conn, tree_id, self.backend.name)
            if lease.state == "active" and lease.handle == handle:
                return False
            await asyncio.wait_for(self.backend.release(handle), _RELEASE_TIMEOUT_SECONDS)
        log.warning("reaped orphan sandbox %s of tree %s", handle, tree_id)
        return True

    def close(self) -> None:
        """Close the backend's client resources; the sandboxes and leases stay as they are."""
        self.backend.close()

    async def sweep_forever(self, interval_seconds: float) -> None:
        """Call ``release_idle`` every ``interval_seconds`` until cancelled."""
        while True:
            try:
                await self.release_idle()
            except Exception:  # a DB outage must not end the sweeper
                log.exception("sandbox idle sweep failed")
            await asyncio.sleep(interval_seconds)


def options_from_settings(settings: Settings) -> SandboxOptions:
    return SandboxOptions(image=settings.sandbox_image)


def choose_backend(settings: Settings | None = None) -> SandboxBackend:
    """Docker when configured, or in ``auto`` mode when an engine answers; else the local backend."""
    settings = settings or get_settings()
    if settings.sandbox_backend == "local":
        return LocalBackend()
    client = docker_client_if_answering()
    if client is not None:
        return DockerBackend(client)
    if settings.sandbox_backend == "docker":
        raise SandboxError("CANOPY_SANDBOX_BACKEND is 'docker' but no Docker engine answers")
    log.warning("no Docker engine answers: using the local process sandbox, which does NOT isolate commands")
    return LocalBackend()


def docker_client_if_answering(timeout: float = _PING_TIMEOUT_SECONDS) -> docker.DockerClient | None:
    """A Docker client if an engine answers a ping within ``timeout`` seconds, else None."""
    try:
        probe = docker.from_env(timeout=timeout)
        try:
            probe.ping()
        finally:
            probe.close()
        return docker.from_env(timeout=60, max_pool_size=64)
    except (docker.errors.DockerException, OSError) as error:
        log.info("no Docker engine answers: %s", error)
        return None
