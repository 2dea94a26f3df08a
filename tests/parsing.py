"""``ast.parse`` for the tests that read the project's sources.

CPython 3.11.7 can fail a parse with a spurious ``SystemError: AST constructor recursion depth
mismatch`` in a process with other threads (python/cpython#106905; CI saw it once in a test
process, which has Ray's threads and the event loop's executors). The source is the same either
way, so a parse that fails that way is asked again; a syntax error still fails at once.
"""

from __future__ import annotations

import ast
import contextlib

_ATTEMPTS = 3


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for _ in range(_ATTEMPTS - 1):
        with contextlib.suppress(SystemError):
            return ast.parse(source, filename)
    return ast.parse(source, filename)
