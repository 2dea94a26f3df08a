"""Every model tool by name, the schemas sent to the model, and argument validation."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from actors.sandbox_tools import SANDBOX_TOOLS
from actors.tools import COOPERATION_TOOLS, SandboxTool, Tool, ToolArgs
from persistence.errors import InvalidArgument

TOOLS: dict[str, Tool | SandboxTool] = {tool.name: tool for tool in [*COOPERATION_TOOLS, *SANDBOX_TOOLS]}


def schemas(names: list[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI function-tool definitions: the agent's tools, or all of them (not to be mutated)."""
    return _schemas(tuple(names) if names else None)


@functools.cache
def _schemas(names: tuple[str, ...] | None) -> list[dict[str, Any]]:
    # Built once per tool set: pydantic's JSON schema costs ~2 ms, and every model call sends it.
    chosen = [TOOLS[n] for n in names if n in TOOLS] if names else list(TOOLS.values())
    return [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                              "parameters": tool.args.model_json_schema()}} for tool in chosen]


def parse_args(name: str, raw: dict[str, Any]) -> tuple[Tool | SandboxTool, ToolArgs]:
    tool = TOOLS.get(name)
    if tool is None:
        raise InvalidArgument(f"unknown tool {name!r}")
    try:
        return tool, tool.args.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                             for e in error.errors())
        raise InvalidArgument(f"invalid arguments for {name}: {problems}") from None
