"""Pause points for crash tests, off unless configured.

Setting ``failpoints`` (``CANOPY_FAILPOINTS="after_model_commit=3"``) makes a Run of a session
whose *name* starts with ``fp-`` pause 3 seconds at that point, so a test can kill its actor at
an exact step of the write-through protocol. Points: ``before_model_call``,
``after_model_commit`` (the assistant message with tool calls is committed, no tool
has run), ``during_compaction`` (a compaction summary was answered, not committed),
``after_command_receipt`` (a command finished and its receipt is committed, its tool
message is not).
"""

from __future__ import annotations

import asyncio
import functools

from persistence.settings import get_settings

_SESSION_PREFIX = "fp-"


@functools.cache
def _parse(spec: str) -> dict[str, float]:
    points = (item.split("=", 1) for item in spec.split(",") if "=" in item)
    return {name.strip(): float(seconds) for name, seconds in points}


async def pause(point: str, session_name: str) -> None:
    seconds = _parse(get_settings().failpoints).get(point)
    if seconds and session_name.startswith(_SESSION_PREFIX):
        await asyncio.sleep(seconds)
