"""The layers hold: SQL text lives in persistence/ only, and persistence/ imports no upper layer.

Both are read from the source with ``ast``: every string constant outside persistence/ (f-string
pieces included, docstrings excluded: they are prose, never executed) is matched against SQL's
statement shapes, and every import of persistence/ is checked against the layers above it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.parsing import parse

ROOT = Path(__file__).resolve().parents[1]
UPPER_LAYERS = ("actors", "api", "sandbox")

# Statement shapes, case-sensitive: SQL keywords are written in capitals here, prose is not.
SQL = re.compile(r"\b(SELECT\s+\S|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|pg_notify|"
                 r"LISTEN\s+[{\w]|NOTIFY\s+\w|SHOW\s+\w+_\w)")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string in ``tree`` but docstrings; an f-string whole, ``{}`` for each value."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            yield node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def sql_constants(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each string in ``source`` that reads as SQL."""
    return ((line, text) for line, text in _strings(parse(source)) if SQL.search(text))


def _sources(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_the_sql_finder_tells_sql_from_prose() -> None:
    sql = ['"SELECT 1"', '"SELECT pg_notify(%s, %s)"', 'f"LISTEN {channel}"', '"SHOW server_version"',
           '"""\nINSERT INTO t (a) VALUES (%s)\n"""', '"UPDATE runs SET owner = NULL"', '"DELETE FROM t"']
    prose = ['"""A module docstring: SELECT ... FOR UPDATE, described."""', '"select a model"',
             '"Select the tree"', '"LISTEN"', '"the UPDATE of a row"']
    for text in sql:
        assert list(sql_constants(f"q = {text}")), text
    for text in prose[1:]:
        assert not list(sql_constants(f"q = {text}")), text
    assert not list(sql_constants(prose[0]))
    assert not list(sql_constants('def f() -> None:\n    """SELECT 1 is how it pings."""\n'))


def test_no_sql_outside_persistence() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text.strip()[:80]!r}"
             for path in _sources(*UPPER_LAYERS) for line, text in sql_constants(path.read_text())]
    assert not found, "SQL text outside persistence/ (move it to a named query):\n" + "\n".join(found)


def _imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def test_persistence_imports_no_upper_layer() -> None:
    paths = list(_sources("persistence"))
    assert any(path.name == "db.py" for path in paths)  # the package is read, not empty
    found = [f"{path.relative_to(ROOT)}:{line}: imports {module}"
             for path in paths for line, module in _imported_modules(parse(path.read_text()))
             if module.split(".")[0] in UPPER_LAYERS]
    assert not found, "persistence/ imports an upper layer:\n" + "\n".join(found)
