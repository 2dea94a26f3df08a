"""Reading a ``#!script``: its steps, and the ``${N.path}`` references in their strings.

A script comes from an Input text, which users and other models write, so every parse here is a
single left-to-right scan, linear in the text's size (no backtracking regular expressions), and
what a script may make the model do is bounded: the script's size before it is parsed, the text its
references expand to while they are resolved.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

SCRIPT_MARKER = "#!script"
# Error messages quote hostile text; this much of it identifies it.
_QUOTE_CHARS = 80
# A step's delay_ms and stream_ms, each at most: ten minutes, past a call's deadline at the gateway's
# default settings (120 s for each of its 3 attempts).
MAX_STEP_MS = 600_000


class ScriptError(Exception):
    """The request cannot be answered as scripted; reported to the caller as HTTP 400."""


def _quote(text: str) -> str:
    """``text``, shortened for an error message."""
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1] + "…"


def _list_position(key: str, length: int) -> int | None:
    """``key`` as a position in a sequence of ``length`` items, or None when it is not one.

    A key with more digits than ``length`` has is never converted to an integer: a hostile run of
    100,000 digits would cost quadratic time (and raise past Python's conversion limit).
    """
    if not key.isdecimal():
        return None
    digits = key.lstrip("0") or "0"
    if len(digits) > len(str(length)):
        return None
    position = int(digits)
    return position if position < length else None


# ---------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------


def _script_body(text: str) -> str | None:
    """The text after the first ``#!script`` line of an Input, or None when it has none."""
    lines = text.split("\n")
    marker = next((i for i, line in enumerate(lines) if line.strip() == SCRIPT_MARKER), None)
    return None if marker is None else "\n".join(lines[marker + 1 :])


def parse_script(text: str, max_bytes: int) -> list[dict[str, Any]] | None:
    """The script embedded in an Input text, or None when the text has no ``#!script`` line.

    A script over ``max_bytes`` (UTF-8) is refused before it is parsed.
    """
    body = _script_body(text)
    if body is None:
        return None
    # A character takes at least one byte: a body of more characters than the limit is over it unencoded.
    size = len(body) if len(body) > max_bytes else len(body.encode())
    if size > max_bytes:
        raise ScriptError(f"the script after '{SCRIPT_MARKER}' is over {max_bytes} bytes (the scripted model's "
                          f"limit, CANOPY_SCRIPTED_MAX_SCRIPT_BYTES); it was not parsed")
    try:
        script = json.loads(body)
    except RecursionError as exc:
        raise ScriptError(f"invalid script: the text after '{SCRIPT_MARKER}' is nested too deeply") from exc
    except ValueError as exc:
        raise ScriptError(
            f"invalid script: the text after '{SCRIPT_MARKER}' is not valid JSON ({exc})"
        ) from exc
    if not isinstance(script, list):
        raise ScriptError(f"invalid script: expected a JSON list of steps, got {type(script).__name__}")
    for index, step in enumerate(script):
        _validate_step(index, step)
    return script


def _validate_step(index: int, step: Any) -> None:
    where = f"invalid script step {index}"
    if not isinstance(step, dict):
        raise ScriptError(f"{where}: expected an object, got {type(step).__name__}")
    kinds = [k for k in ("call", "say", "fail") if k in step]
    if len(kinds) != 1:
        raise ScriptError(f"{where}: needs exactly one of 'call', 'say', 'fail'")
    for key in ("delay_ms", "stream_ms"):
        value = step.get(key, 0)
        # The server's timers are its model gateway's: a NaN in that loop's timer heap breaks the order of
        # every model call's timers on the node (JSON as Python reads it spells NaN and Infinity).
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_STEP_MS:
            raise ScriptError(f"{where}: '{key}' must be a number of milliseconds from 0 to {MAX_STEP_MS:,}")
    if kinds[0] == "call":
        calls = step["call"]
        if not isinstance(calls, list) or not calls:
            raise ScriptError(f"{where}: 'call' must be a non-empty list")
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ScriptError(f"{where}: every call needs a string 'name'")
            if not isinstance(call.get("args", {}), dict):
                raise ScriptError(f"{where}: 'args' of {_quote(call['name'])} must be an object")
    elif not isinstance(step[kinds[0]], str):
        raise ScriptError(f"{where}: '{kinds[0]}' must be a string")


# ---------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """One ``${N.dotted.path}`` (or, escaped, ``$${...}``) at ``text[start:end]``."""

    start: int
    end: int
    source: str
    escaped: bool
    index: str
    path: tuple[str, ...]


def find_references(text: str) -> Iterator[Reference]:
    """The references in ``text``, left to right and not overlapping, in one linear scan.

    The grammar: ``$`` ``{`` decimal digits, then zero or more ``.segment`` (a segment is one or
    more characters other than ``.``, ``{`` and ``}``), then ``}``; one more ``$`` in front escapes
    it. Every scan from a ``${`` stops at the next ``{``, the start of the next candidate, so no
    character is read more than a constant number of times.
    """
    position = 0
    while (opening := text.find("${", position)) >= 0:
        digits_end = opening + 2
        while digits_end < len(text) and text[digits_end].isdecimal():
            digits_end += 1
        next_opening = text.find("{", digits_end)
        closing = text.find("}", digits_end, len(text) if next_opening < 0 else next_opening)
        path = _path(text[digits_end:closing]) if closing >= 0 and digits_end > opening + 2 else None
        if path is None:
            position = opening + 2
            continue
        escaped = opening > 0 and text[opening - 1] == "$"
        start = opening - 1 if escaped else opening
        yield Reference(start, closing + 1, text[start : closing + 1], escaped, text[opening + 2 : digits_end], path)
        position = closing + 1


def _path(text: str) -> tuple[str, ...] | None:
    """The segments of ``.a.b`` (an empty text is the empty path), or None when it is not a path."""
    if not text:
        return ()
    segments = tuple(text.split("."))
    if segments[0] or not all(segments[1:]):
        return None
    return segments[1:]


class ToolResults(Protocol):
    """The tool results of the current Turn, by the 0-based position of their call."""

    @property
    def call_count(self) -> int: ...

    def raw_result(self, index: int) -> str: ...

    def result(self, index: int) -> Any: ...


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class _Resolver:
    """Resolves references against tool results while counting the text they expand to.

    A script can repeat a reference to a large tool result many times, so the expansion, not the
    script, decides the reply's size: it is bounded by ``max_chars``.
    """

    def __init__(self, results: ToolResults, max_chars: int) -> None:
        self.results = results
        self.max_chars = max_chars
        self.left = max_chars

    def _spend(self, text: str) -> str:
        self.left -= len(text)
        if self.left < 0:
            raise ScriptError(f"the script's references expand to over {self.max_chars} characters of reply "
                              f"(the scripted model's limit, CANOPY_SCRIPTED_MAX_REQUEST_BYTES)")
        return text

    def value(self, reference: Reference) -> Any:
        if reference.escaped:
            return self._spend(reference.source[1:])
        index = _list_position(reference.index, self.results.call_count)
        if index is None:
            raise ScriptError(f"reference to tool call {_quote(reference.index)}, but this Turn has only "
                              f"{self.results.call_count} tool call(s)")
        if not reference.path:
            # The whole result "as JSON": the tool message text is that JSON already.
            return self._spend(self.results.raw_result(index))
        value = _lookup(self.results.result(index), reference.path, reference.source)
        self._spend(as_text(value))
        return value

    def resolve(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, str):
            return value
        found = find_references(value)
        first = next(found, None)
        if first is None:
            return value
        if first.start == 0 and first.end == len(value):
            return self.value(first)
        pieces, position = [], 0
        for reference in (first, *found):
            pieces += [value[position : reference.start], as_text(self.value(reference))]
            position = reference.end
        pieces.append(value[position:])
        return "".join(pieces)


def _lookup(value: Any, path: tuple[str, ...], reference: str) -> Any:
    for key in path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and (position := _list_position(key, len(value))) is not None:
            value = value[position]
        else:
            raise ScriptError(f"reference {_quote(reference)}: no '{_quote(key)}' in {json.dumps(value)[:200]}")
    return value


def resolve_references(value: Any, results: ToolResults, max_chars: int) -> Any:
    """Replace the references inside every string of a JSON-like value; a string that is exactly one
    reference takes the referenced value's type. The text references expand to is at most
    ``max_chars`` in all."""
    return _Resolver(results, max_chars).resolve(value)
