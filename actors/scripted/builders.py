"""Builders of scripted Inputs: the public way to write a script for the scripted model.

An Input built with :func:`script` makes a session running ``canopy/scripted`` answer step by step
as written, which is how tests, demos and benchmarks drive real trees deterministically::

    script(
        call(create("research", "Find the facts."), create("draft", script(say("a draft")))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
        say("Both answered: ${2.results}"),
        task="Plan the launch.",
    )

A step's strings may reference this Turn's tool results as ``${N.dotted.path}`` (N counts the
Turn's tool calls from 0); write ``$${...}`` for a reference a child's own script must keep.
"""

from __future__ import annotations

import json
from typing import Any

from actors.scripted.script import SCRIPT_MARKER


def script(*steps: dict[str, Any], task: str = "task") -> str:
    """An Input text: ``task``, then the ``#!script`` line and the steps as a JSON list."""
    return f"{task}\n{SCRIPT_MARKER}\n" + json.dumps(list(steps))


def say(text: str, delay_ms: int = 0, stream_ms: int = 0) -> dict[str, Any]:
    """A step that answers ``text`` (the Turn's output when it is the last step), after ``delay_ms``
    and, when streamed, spread over ``stream_ms``."""
    return {"say": text, "delay_ms": delay_ms, "stream_ms": stream_ms}


def call(*calls: tuple[str, dict[str, Any]], delay_ms: int = 0) -> dict[str, Any]:
    """A step of parallel tool calls, each a ``(tool name, arguments)`` pair, after ``delay_ms``."""
    return {"call": [{"name": name, "args": args} for name, args in calls], "delay_ms": delay_ms}


def create(name: str, description: str) -> tuple[str, dict[str, Any]]:
    """The ``create_session`` call of a child named ``name`` whose task is ``description`` (which may
    itself be a :func:`script`)."""
    return ("create_session", {"name": name, "description": description})
