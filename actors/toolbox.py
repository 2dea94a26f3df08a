"""Every model tool by name, the schemas sent to the model, and argument validation."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from actors.model_gateway import INVALID_ARGUMENTS, MAX_ARGUMENT_DEPTH, NUMBER_GROWTH_CHARS
from actors.sandbox_tools import SANDBOX_TOOLS
from actors.tools import COOPERATION_TOOLS, SandboxTool, Tool, ToolArgs
from persistence.errors import InvalidArgument, shown

TOOLS: dict[str, Tool | SandboxTool] = {tool.name: tool for tool in [*COOPERATION_TOOLS, *SANDBOX_TOOLS]}
# How much of arguments that are not a JSON object the model is shown back.
_EXCERPT_CHARS = 200
# How many of a call's invalid arguments the model is told of (then how many more there are).
_PROBLEMS_SHOWN = 5


def effective_tools(configured: list[str] | None) -> frozenset[str]:
    """A session's tools: those its frozen agent config names, or every tool when it names none
    (the SPEC's default). What the model is offered and what the executor accepts are this set."""
    return frozenset(configured or ()) & TOOLS.keys() if configured else frozenset(TOOLS)


def check_tool_names(names: list[str]) -> None:
    """Refuse an agent config naming a tool Canopy does not have (InvalidArgument)."""
    unknown = sorted(set(names) - TOOLS.keys())
    if unknown:
        raise InvalidArgument(f"unknown tool(s) {', '.join(map(repr, unknown))}; the tools are: {', '.join(TOOLS)}")


def schemas(names: frozenset[str]) -> list[dict[str, Any]]:
    """OpenAI function-tool definitions of these tools, in a stable order (not to be mutated)."""
    return _schemas(tuple(name for name in TOOLS if name in names))


@functools.cache
def _schemas(names: tuple[str, ...]) -> list[dict[str, Any]]:
    # Built once per tool set: pydantic's JSON schema costs ~2 ms, and every model call sends it.
    return [{"type": "function", "function": {"name": TOOLS[name].name, "description": TOOLS[name].description,
                                              "parameters": TOOLS[name].args.model_json_schema()}}
            for name in names]


def parse_args(name: str, raw: dict[str, Any], allowed: frozenset[str]) -> tuple[Tool | SandboxTool, ToolArgs]:
    """The tool and its validated arguments; InvalidArgument for a tool outside ``allowed`` (the
    session's tools: a call the model was not offered is refused here, where it would run)."""
    tool = TOOLS.get(name) if name in allowed else None
    if tool is None:
        what = "unknown tool" if name not in TOOLS else "tool"
        raise InvalidArgument(f"{what} {name!r} is not available to this session; its tools are: "
                              f"{', '.join(n for n in TOOLS if n in allowed) or 'none'}")
    if INVALID_ARGUMENTS in raw:
        excerpt = shown(str(raw[INVALID_ARGUMENTS]), limit=_EXCERPT_CHARS, keep=_EXCERPT_CHARS)
        raise InvalidArgument(f"the arguments of {name} are not a JSON object nested at most {MAX_ARGUMENT_DEPTH} "
                              f"levels deep with no NUL character (U+0000) or lone surrogate in its strings, "
                              f"whose numbers written out in full add at most {NUMBER_GROWTH_CHARS:,} characters: "
                              f"{excerpt}; call it again with its arguments as one JSON object")
    try:
        return tool, tool.args.model_validate(raw)
    except ValidationError as error:
        raise InvalidArgument(f"invalid arguments for {name}: {_problems(error)}") from None


def _problems(error: ValidationError) -> str:
    """The first few problems, a key past _EXCERPT_CHARS named by its start: a model's arguments may
    hold a hundred thousand extra keys, or one of a megabyte, and the sentence goes back into every
    later model call of its Turn."""
    found = error.errors()
    named = []
    for problem in found[:_PROBLEMS_SHOWN]:
        where = ".".join(str(part) for part in problem["loc"]) or "arguments"
        named.append(f"{where if len(where) <= _EXCERPT_CHARS else shown(where, _EXCERPT_CHARS)}: {problem['msg']}")
    more = f"; and {len(found) - _PROBLEMS_SHOWN} more" if len(found) > _PROBLEMS_SHOWN else ""
    return "; ".join(named) + more
