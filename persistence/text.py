"""Text PostgreSQL can store. Its text and jsonb hold no NUL character (U+0000), and a Python
string can hold a lone surrogate (from a JSON ``\\ud800`` escape) that UTF-8 cannot encode: either
fails the statement that writes it. Text from a client is refused with :func:`why_unstorable`; text
from a model or a command, which must be kept whatever it holds, goes through :func:`storable`.

JSON a model is sent is written by :func:`json_text`, and a tool result's text through
:func:`pictured`, so that what the model reads again at every later call is the size it was.
"""

from __future__ import annotations

import json
import re
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# JSON writes a C0 control character but tab, newline and carriage return as a 6-character escape.
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
_PICTURES = {code: 0x2400 + code for code in range(0x20) if chr(code) not in "\t\n\r"}


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


def json_text(value: Any) -> str:
    """``value`` as the JSON text a model is sent: its characters as written. ASCII-escaped, a CJK
    character took 6 characters and an emoji 12, in every later request of a conversation."""
    return json.dumps(value, ensure_ascii=False)


def pictured(text: str) -> str:
    """``text`` with each C0 control character but tab, newline and carriage return as its Control
    Picture (U+2400 + its code: ESC is ␛), one character for JSON's six: a terminal's colour codes or
    a binary file's bytes put a capped output at six times its cap in every later request."""
    return text.translate(_PICTURES) if _CONTROLS.search(text) else text
