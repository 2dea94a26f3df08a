"""Backend choice: Docker when configured or when an engine answers in ``auto``; else local."""

from __future__ import annotations

from pathlib import Path

import pytest

from persistence.settings import Settings
from sandbox.base import SandboxError
from sandbox.docker_backend import DockerBackend
from sandbox.local_backend import LocalBackend
from sandbox.manager import choose_backend, docker_client_if_answering


def test_local_when_configured() -> None:
    assert isinstance(choose_backend(Settings(sandbox_backend="local")), LocalBackend)


def test_no_engine_means_local_in_auto_and_an_error_in_docker_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A real, unreachable engine address: nothing listens on this socket.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")

    assert isinstance(choose_backend(Settings(sandbox_backend="auto")), LocalBackend)
    with pytest.raises(SandboxError, match="no Docker engine answers"):
        choose_backend(Settings(sandbox_backend="docker"))


def test_docker_when_an_engine_answers() -> None:
    probe = docker_client_if_answering()
    if probe is None:
        pytest.skip("no Docker engine answers (start one with: bash .ci/docker-up.sh)")
    probe.close()
    for mode in ("auto", "docker"):
        backend = choose_backend(Settings(sandbox_backend=mode))
        assert isinstance(backend, DockerBackend) and backend.client.ping()
        backend.close()
