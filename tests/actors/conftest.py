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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``) all of one shape's tests go to one worker, so each
    worker starts a shape's Ray once instead of switching shapes test by test."""
    for item in items:
        shape = getattr(getattr(item, "callspec", None), "params", {}).get("runtime")
        if shape in SHAPES:
            item.add_marker(pytest.mark.xdist_group(f"shape-{shape}"))
