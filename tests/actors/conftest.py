"""A real local Ray with the Canopy runtime on the test database, shared by the actor tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import ray

from actors.runtime import Runtime
from persistence.settings import Settings

# Short leases and sweeps so that kill tests recover in seconds, not minutes.
RUNTIME_ENV = {
    "CANOPY_LEASE_SECONDS": "4",
    "CANOPY_HEARTBEAT_SECONDS": "1",
    "CANOPY_SWEEP_SECONDS": "0.5",
    "CANOPY_ACTOR_IDLE_SECONDS": "6",
    "CANOPY_FAILPOINTS": "before_model_call=3,after_model_commit=3,after_command_receipt=3",
}


@pytest.fixture(scope="session")
async def runtime(database_url: str, data_dir: Path) -> AsyncIterator[Runtime]:
    os.environ.update(RUNTIME_ENV)
    os.environ["CANOPY_DATABASE_URL"] = database_url
    os.environ["CANOPY_DATA_DIR"] = str(data_dir)
    settings = Settings()
    rt = await Runtime.start(settings, num_cpus=2, include_dashboard=True)
    yield rt
    await rt.close()
    ray.shutdown()
