"""actors/ imports form no cycle: each module's imports of other actors modules, read with ``ast``
(every import, at module level or inside a function or an ``if``), point one way."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.parsing import parse

ACTORS = Path(__file__).resolve().parents[2] / "actors"


def _module(path: Path) -> str:
    parts = path.relative_to(ACTORS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The actors modules ``path`` imports (``from actors import x`` counts as actors.x when x is one)."""
    found = set()
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules} - {_module(path)}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(ACTORS.rglob("*.py"))
    modules = {_module(path) for path in paths}
    return {_module(path): _imports(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*stack[stack.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_actors_modules_import_each_other_without_a_cycle() -> None:
    graph = import_graph()
    assert "actors.agent_loop" in graph["actors.session_actor"]  # the graph is read, not empty
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
