"""A reply's tool calls get ids unique within their Turn, in time linear in the calls: a hostile
reply of thousands of calls with one id must not hold the session host's event loop (which serves
every session of the host) for the square of that."""

from __future__ import annotations

from typing import Any

from actors.agent_loop import _with_unique_ids


class _CountedSet(set[str]):
    """A set that counts how often it is asked whether it holds an id."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lookups = 0

    def __contains__(self, item: object) -> bool:
        self.lookups += 1
        return super().__contains__(item)


def test_ids_a_reply_repeats_are_made_unique_in_linear_time() -> None:
    calls = [{"id": "call_0", "name": "list_agents", "arguments": {}}] * 3000 + \
        [{"name": "list_agents", "arguments": {}}] * 3000 + [{"id": "call_0_2", "name": "x", "arguments": {}}]
    taken = _CountedSet({"call_0", "call_5"})
    renamed = _with_unique_ids(calls, taken)
    ids = [call["id"] for call in renamed]
    assert len(set(ids)) == len(ids) == len(calls)
    assert not {"call_0", "call_5"} & set(ids)
    assert ids[:3] == ["call_0_2", "call_0_3", "call_0_4"] and ids[3000:3002] == ["call", "call_2"]
    assert ids[-1] == "call_0_2_2"  # its own id was given to the first repeat of call_0
    assert taken.lookups <= 3 * len(calls), taken.lookups
