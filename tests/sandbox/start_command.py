"""Run one sandbox command from a process of its own, so that a test can kill -9 that process.

``python -m tests.sandbox.start_command KIND DATABASE_URL STATE_ROOT TREE_ID WORKDIR COMMAND_ID COMMAND``
(KIND ``docker`` or ``local``; STATE_ROOT is the local backend's). It claims the tree's sandbox
through a manager of its own and runs the command until it ends or this process is killed.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

from persistence.db import Database
from sandbox.base import SandboxBackend
from sandbox.docker_backend import DockerBackend
from sandbox.local_backend import LocalBackend
from sandbox.manager import SandboxManager
from tests.sandbox.conftest import sandbox_options


async def main(kind: str, url: str, state_root: str, tree: str, workdir: str, command_id: str, command: str) -> None:
    db = await Database.connect(url, max_size=2)
    backend: SandboxBackend = DockerBackend() if kind == "docker" else LocalBackend(Path(state_root))
    manager = SandboxManager(db, backend, 300, sandbox_options())
    await manager.run_command(uuid.UUID(tree), Path(workdir), command, 600, command_id)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
