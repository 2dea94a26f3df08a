"""Context compaction: when a model call would send more tokens than a session's threshold, a summary
of the session's earlier messages stands for them in what the model is sent from then on.

Only messages before the current Turn are summarised (a Turn's own input, replies and results stay
as they are: the model is in the middle of them), so the summary is asked for at a model boundary,
by a model call through the gateway with the instructions below, and committed as one message
(persistence/messages.py ``append_summary``) fenced by the Run's lease: a crash before that commit
asks again (model calls are at-least-once), a crash after it finds the summary and starts from it,
so a session never gets two summaries for one compaction. The original messages stay in the
database and in the UI, where the summary shows as a "compacted here" marker.
"""

from __future__ import annotations

import json
from typing import Any

from persistence.records import Row

INSTRUCTIONS = (
    "You summarise the earlier part of a conversation for the assistant that continues it. Keep every "
    "fact, decision, name, id (session, input, turn ids), file path, result and open question the "
    "assistant may need; drop pleasantries and repetition. Write the summary only, as plain text.")
# The transcript sent for summarising keeps its most recent part when it is longer than this many
# characters per threshold token (about what the threshold itself allows).
_CHARS_PER_TOKEN = 4
OPEN_TAG = "<canopy:compact>"


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """A cheap estimate of a request's prompt tokens (characters / 4): the exact count (litellm's
    counter, in the gateway) is asked only when this comes near the threshold."""
    chars = sum(len(str(m.get("content") or "")) + len(json.dumps(m.get("tool_calls") or [])) for m in messages)
    return (chars + (len(json.dumps(tools)) if tools else 0)) // _CHARS_PER_TOKEN


def earlier_messages(history: list[Row], turn_id: Any) -> list[Row]:
    """The messages before the current Turn's (a prefix of the history): what a summary may stand for."""
    for position, row in enumerate(history):
        if row["turn_id"] == turn_id:
            return history[:position]
    return list(history)


def _line(row: Row) -> str:
    role = row["role"]
    if (row["origin"] or {}).get("kind") == "compaction":
        return f"[an earlier summary]\n{row['content']}"
    if role == "assistant":
        calls = "; ".join(f"{c.get('name')}({json.dumps(c.get('arguments'))})" for c in row["tool_calls"] or [])
        return f"assistant: {row['content'] or ''}" + (f"\n[tool calls] {calls}" if calls else "")
    if role == "tool":
        return f"[tool result {row['tool_call_id']}] {row['content']}"
    return f"user: {row['content']}"


def request(earlier: list[Row], threshold: int) -> list[dict[str, Any]]:
    """The summarising model call's messages: the instructions, and the transcript to summarise
    (its most recent part when it is too long to send whole)."""
    transcript = "\n\n".join(_line(row) for row in earlier)
    budget = threshold * _CHARS_PER_TOKEN
    if len(transcript) > budget:
        transcript = "[…older messages left out…]\n" + transcript[-budget:]
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"{OPEN_TAG}\n{transcript}\n</canopy:compact>"}]
