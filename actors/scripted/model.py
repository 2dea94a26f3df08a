"""What the scripted model answers: its reply to one chat completion request, decided only from the
request's messages so that it is deterministic and a replayed Run gets the same answers.

Every message is untrusted text, so all reading here is linear in the request's size: plain string
scanning, and every derived value (a tool call's id tag, a parsed tool result) computed once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors.scripted.script import ScriptError, as_text, parse_script, resolve_references

if TYPE_CHECKING:
    from persistence.settings import Settings

MODEL_ID = "scripted"
FINAL_TEXT = "script finished"
CANOPY_PREFIX = "<canopy:"

_DEMO_CHILDREN = (
    ("research", "Research the background and key facts needed for this task: {task}"),
    ("draft", "Draft a direct answer to this task: {task}"),
    ("review", "Review the likely pitfalls and open questions of this task: {task}"),
)
# Short tasks get two children, longer ones three: deterministic and visibly task-dependent.
_THREE_CHILDREN_MIN_WORDS = 8
_TASK_QUOTE_LIMIT = 200


@dataclass(frozen=True)
class Limits:
    """What one request may make the scripted model do; beyond it the request is refused (HTTP 400)
    before the work. A reply may be as large as a request: larger, it could not be sent back in the
    conversation's next request anyway."""

    request_bytes: int
    script_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(request_bytes=settings.scripted_max_request_bytes,
                   script_bytes=settings.scripted_max_script_bytes)


# ---------------------------------------------------------------------------
# Reading the request
# ---------------------------------------------------------------------------


def content_text(content: Any) -> str:
    """Plain text of an OpenAI message content (a string or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(str(p) for p in parts)
    return str(content)


@dataclass
class TurnView:
    """What the scripted model knows about the current Turn, derived from the messages."""

    input_index: int
    input_text: str
    step: int
    system_text: str
    tool_names: frozenset[str] | None
    call_ids: list[str] = field(default_factory=list)
    call_names: list[str] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    _parsed: dict[int, Any] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def tag(self) -> str:
        # Ties tool call ids to this Input so that ids stay unique across the Turns of a
        # session yet are identical when a Run is replayed from the same history.
        digest = hashlib.sha1(f"{self.input_index}:{self.input_text}".encode()).hexdigest()
        return digest[:8]

    @property
    def call_count(self) -> int:
        return len(self.call_ids)

    def raw_result(self, index: int) -> str:
        call_id = self.call_ids[index]
        if call_id not in self.results:
            raise ScriptError(f"reference to tool call {index} ({call_id}), which has no tool result yet")
        return self.results[call_id]

    def result(self, index: int) -> Any:
        if index not in self._parsed:
            raw = self.raw_result(index)
            try:
                self._parsed[index] = json.loads(raw)
            except (ValueError, RecursionError):
                self._parsed[index] = raw
        return self._parsed[index]


def _is_input(message: dict[str, Any]) -> bool:
    if message.get("role") != "user":
        return False
    return not content_text(message.get("content")).lstrip().startswith(CANOPY_PREFIX)


def _tool_names(tools: list[dict[str, Any]] | None) -> frozenset[str] | None:
    if tools is None:
        return None
    names = {(t.get("function") or {}).get("name") or t.get("name") for t in tools if isinstance(t, dict)}
    return frozenset(n for n in names if n)


def read_turn(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> TurnView:
    input_index = next((i for i in range(len(messages) - 1, -1, -1) if _is_input(messages[i])), -1)
    system = next((m for m in messages if m.get("role") == "system"), None)
    turn = TurnView(
        input_index=input_index,
        input_text=content_text(messages[input_index].get("content")) if input_index >= 0 else "",
        step=0,
        system_text=content_text(system.get("content")) if system else "",
        tool_names=_tool_names(tools),
    )
    for message in messages[input_index + 1 :]:
        if message.get("role") == "assistant":
            turn.step += 1
            for call in message.get("tool_calls") or []:
                turn.call_ids.append(str(call.get("id")))
                turn.call_names.append(str((call.get("function") or {}).get("name", "")))
        elif message.get("role") == "tool":
            turn.results[str(message.get("tool_call_id"))] = content_text(message.get("content"))
    return turn


def identity_values(system_text: str, key: str) -> Iterator[str]:
    """The values of the system prompt's ``key: value`` lines (``key`` in any case, the line
    optionally a ``-`` or ``*`` list item), in order; lines with no value are skipped."""
    for line in system_text.split("\n"):
        item = line.strip()
        if item[:1] in ("-", "*"):
            item = item[1:].lstrip()
        name, colon, value = item.partition(":")
        value = value.strip()
        if colon and value and name.rstrip().lower() == key:
            yield value


def _is_root(system_text: str) -> bool:
    role = next((v for v in identity_values(system_text, "role") if v.lower() in ("root", "child")), None)
    return role == "root"


# ---------------------------------------------------------------------------
# Replies
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One model response: text and/or OpenAI tool calls, or a provider failure."""

    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    fail: str | None = None
    delay_ms: float = 0
    stream_ms: float = 0


def _tool_call(turn: TurnView, position: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{turn.tag}_{turn.step}_{position}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _calls(turn: TurnView, calls: list[tuple[str, dict[str, Any]]], **timing: float) -> Reply:
    tool_calls = tuple(_tool_call(turn, i, name, args) for i, (name, args) in enumerate(calls))
    return Reply(tool_calls=tool_calls, **timing)


def _script_reply(script: list[dict[str, Any]], turn: TurnView, limits: Limits) -> Reply:
    if turn.step >= len(script):
        return Reply(content=FINAL_TEXT)
    step = script[turn.step]
    timing = {key: float(step.get(key, 0)) for key in ("delay_ms", "stream_ms")}
    if "fail" in step:
        return Reply(fail=step["fail"], **timing)
    if "say" in step:
        return Reply(content=as_text(resolve_references(step["say"], turn, limits.request_bytes)), **timing)
    # One budget for the whole step: its calls' arguments are one reply.
    args = resolve_references([c.get("args", {}) for c in step["call"]], turn, limits.request_bytes)
    return _calls(turn, [(c["name"], a) for c, a in zip(step["call"], args, strict=True)], **timing)


def _quote_task(task: str) -> str:
    task = " ".join(task.split())
    return task if len(task) <= _TASK_QUOTE_LIMIT else task[: _TASK_QUOTE_LIMIT - 1] + "…"


def _demo_children(task: str) -> list[tuple[str, dict[str, Any]]]:
    count = 3 if len(task.split()) >= _THREE_CHILDREN_MIN_WORDS else 2
    quoted = _quote_task(task) or "the user's request"
    return [
        ("create_session", {"name": name, "description": template.format(task=quoted)})
        for name, template in _DEMO_CHILDREN[:count]
    ]


def _results_of(turn: TurnView, tool: str) -> list[Any]:
    """Results of every call to ``tool`` in this Turn that has one, in call order."""
    return [
        turn.result(index)
        for index, name in enumerate(turn.call_names)
        if name == tool and turn.call_ids[index] in turn.results
    ]


def _child_name(result: Any) -> str:
    return str(result.get("name", "?")) if isinstance(result, dict) else "?"


def _failure_summary(task: str, created: list[Any]) -> str:
    lines = [f"I could not delegate the task ({_quote_task(task)}):"]
    for position, result in enumerate(created):
        if isinstance(result, dict) and "error" not in result:
            lines.append(f"- child {position + 1} was created: {_child_name(result)}")
        else:
            error = result.get("error") if isinstance(result, dict) else result
            lines.append(f"- child {position + 1} failed: {error}")
    return "\n".join(lines)


def _demo_wait(turn: TurnView) -> Reply:
    created = _results_of(turn, "create_session")
    if not created or any(not isinstance(r, dict) or "error" in r for r in created):
        return Reply(content=_failure_summary(turn.input_text, created))
    return _calls(turn, [("wait_inputs", {"input_ids": [r.get("input_id") for r in created]})])


def _demo_summary(turn: TurnView) -> Reply:
    created = [r for r in _results_of(turn, "create_session") if isinstance(r, dict)]
    names = {r.get("input_id"): _child_name(r) for r in created}
    waits = _results_of(turn, "wait_inputs")
    waited = waits[-1] if waits else None
    lines = [f"Summary for: {_quote_task(turn.input_text)}"]
    if not isinstance(waited, dict) or not isinstance(waited.get("results"), list):
        lines.append(f"Waiting for the children failed: {as_text(waited)}")
        return Reply(content="\n".join(lines))
    for result in waited["results"]:
        name = names.get(result.get("input_id"), result.get("session_id", "?"))
        if result.get("output") is not None:
            lines.append(f'- {name}: "{result["output"]}"')
        else:
            lines.append(f"- {name} ({result.get('status')}): {result.get('error') or 'no output'}")
    if waited.get("timed_out"):
        lines.append("(some children had not finished when the wait timed out)")
    return Reply(content="\n".join(lines))


def _demo_child(turn: TurnView) -> Reply:
    name = next(identity_values(turn.system_text, "name"), "child")
    task = _quote_task(turn.input_text) or "no task given"
    return Reply(content=f"[{name}] Done. My answer to '{task}': it is handled, step by step.")


def _can_delegate(turn: TurnView) -> bool:
    if turn.tool_names is None:
        return False
    return {"create_session", "wait_inputs"} <= turn.tool_names


def _demo_reply(turn: TurnView) -> Reply:
    if not (_is_root(turn.system_text) and _can_delegate(turn)):
        return _demo_child(turn) if turn.step == 0 else Reply(content=FINAL_TEXT)
    if turn.step == 0:
        return _calls(turn, _demo_children(turn.input_text))
    if turn.step == 1:
        return _demo_wait(turn)
    if turn.step == 2:
        return _demo_summary(turn)
    return Reply(content=FINAL_TEXT)


# The opening of a compaction request's transcript (actors/compaction.py).
COMPACT_TAG = "<canopy:compact>"


def _summary(transcript: str) -> Reply:
    """A compaction request's answer: deterministic, short, and naming what it stands for, so a test
    can tell which messages it covered."""
    lines = [f"{role}: {text}" for role, text in _ENTRY.findall(transcript)]
    return Reply(content=f"Summary of {len(lines)} earlier messages. First: {lines[0][:120] if lines else ''}")


# An input's or a reply's entry in the transcript, and the first line of its text.
_ENTRY = re.compile(r'<canopy:entry role="(user|assistant)">\n([^\n]*)')


def check_tool_results(messages: list[Any]) -> None:
    """Refuse a request whose tool calls and results do not pair up, with OpenAI's words, as its API
    does: each call of an assistant message is answered by a tool message before any message of
    another role, and each tool message answers a call of the assistant message before it."""
    unanswered: dict[str, None] = {}  # the calls still to answer, in order
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = str(message.get("tool_call_id"))
            if call_id not in unanswered:
                raise ScriptError("Invalid parameter: messages with role 'tool' must be a response to a "
                                  "preceding message with 'tool_calls'.")
            del unanswered[call_id]
            continue
        if unanswered:
            break
        if role == "assistant":
            unanswered = dict.fromkeys(str(c.get("id")) for c in message.get("tool_calls") or [] if isinstance(c, dict))
    if unanswered:
        raise ScriptError("An assistant message with 'tool_calls' must be followed by tool messages responding "
                          f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          f"{', '.join(unanswered)}")


def plan_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, limits: Limits) -> Reply:
    """The scripted model's answer to one chat completion request (raises ScriptError)."""
    check_tool_results(messages)
    last = content_text(messages[-1].get("content")) if messages else ""
    if messages and messages[-1].get("role") == "user" and last.startswith(COMPACT_TAG):
        return _summary(last)
    turn = read_turn(messages, tools)
    script = parse_script(turn.input_text, limits.script_bytes)
    return _script_reply(script, turn, limits) if script is not None else _demo_reply(turn)
