"""Text PostgreSQL can store. Its text and jsonb hold no NUL character (U+0000), and a Python
string can hold a lone surrogate (from a JSON ``\\ud800`` escape) that UTF-8 cannot encode: either
fails the statement that writes it. Text from a client is refused with :func:`why_unstorable`; text
from a model or a command, which must be kept whatever it holds, goes through :func:`storable`.
"""

from __future__ import annotations

import re

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def why_unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored, or None if it can (one scan when it can: the gateway checks
    every string of every tool call's arguments)."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00" or "\x00" in text:
        return "text must not contain the NUL character"
    return "text must be valid Unicode (no lone surrogates)"


def storable(text: str) -> str:
    """``text`` with U+FFFD (the replacement character) for each character PostgreSQL cannot store."""
    return _UNSTORABLE.sub("\ufffd", text)
