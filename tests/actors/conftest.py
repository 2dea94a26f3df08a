"""The actor tests use the session-scoped ``runtime`` fixture of tests/conftest.py (a real local
Ray with the Canopy runtime on the test database), shared with the API tests. Every actor test
that uses it runs against both placements (actors/placement.py), like a conformance suite:
``runtime`` is parametrized here over tests/conftest.py's ``SHAPES``."""

from __future__ import annotations

import pytest

from tests.conftest import SHAPES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "runtime" in metafunc.fixturenames:
        metafunc.parametrize("runtime", list(SHAPES), indirect=True, scope="session")
