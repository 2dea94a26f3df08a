"""Backend choice: Docker unless the operator chose the local backend; never a silent fallback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pydantic
import pytest

from persistence.settings import Settings
from sandbox.base import SandboxOptions, SandboxUnavailable
from sandbox.docker_backend import DockerBackend, connect
from sandbox.local_backend import LocalBackend
from sandbox.manager import backend_warning, choose_backend


def test_local_only_when_configured_and_then_with_a_warning() -> None:
    assert isinstance(choose_backend(Settings(sandbox_backend="local")), LocalBackend)
    warning = backend_warning(Settings(sandbox_backend="local"))
    assert warning is not None and "NOT isolated" in warning and "\n" not in warning
    assert backend_warning(Settings(sandbox_backend="docker")) is None
    assert Settings().sandbox_backend == "docker"


def test_there_is_no_automatic_choice() -> None:
    with pytest.raises(pydantic.ValidationError):
        Settings(sandbox_backend="auto")


async def test_no_engine_means_a_clear_error_on_use_not_the_local_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A real, unreachable engine address: nothing listens on this socket.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")

    backend = choose_backend(Settings())

    assert isinstance(backend, DockerBackend)
    with pytest.raises(SandboxUnavailable, match=r"no Docker engine answers.*CANOPY_SANDBOX_BACKEND=local"):
        await backend.ensure(uuid.uuid4(), tmp_path / "w", SandboxOptions())
    assert not (tmp_path / "w").exists()
    backend.close()


def test_docker_when_an_engine_answers() -> None:
    try:
        connect().close()
    except SandboxUnavailable:
        pytest.skip("no Docker engine answers (start one with: bash .ci/docker-up.sh)")
    backend = choose_backend(Settings(sandbox_backend="docker"))
    assert isinstance(backend, DockerBackend) and backend.client.ping()
    backend.close()
