"""A compaction made in the middle of a Turn, in a real browser: its marker says which messages the
summary stands for, though it follows the Turn's input and calls, not the messages it summarises."""

from __future__ import annotations

import pytest

from actors.scripted import call, say, script
from tests.ui.helpers import Tab, User, create_root, get, open_root, poll, shoot, wait_result

expect = pytest.importorskip("playwright.async_api").expect


async def test_a_compaction_in_the_middle_of_a_turn_says_what_it_summarises(tab: Tab, user: User) -> None:
    """The marker read "the 2 messages above are summarised": above it were the Turn's own input and
    calls, which the model is still sent whole. It names what the summary stands for: everything
    before the Turn's input."""
    page = tab.page
    # Long enough that a summary (the scripted model's is a line) is at most half of what it stands for.
    first = "first answer, " + "with the details of the plan " * 10
    created = await create_root(user, script(say(first)), title="Compacted mid-turn")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])
    # The human asks for a compaction while the second call is made: the third compacts first.
    second = script(call(("list_sessions", {})), call(("list_sessions", {}), delay_ms=3000), say("second answer"),
                    task="the second task")
    sent = await user.http.post(f"/api/v1/sessions/{root_id}/inputs", json={"text": second})
    assert sent.status_code == 202, sent.text

    async def first_call_answered() -> bool:
        messages = await get(user, f"/sessions/{root_id}/messages")
        return any(m["role"] == "tool" and m["turn_id"] == sent.json()["turn_id"] for m in messages)

    await poll(first_call_answered)  # committed with the next model boundary: the request waits for the third
    response = await user.http.post(f"/api/v1/sessions/{root_id}/compact")
    assert response.status_code == 202, response.text
    await wait_result(user, sent.json()["input_id"])
    messages = await get(user, f"/sessions/{root_id}/messages")
    [summary] = [m for m in messages if m["origin"].get("kind") == "compaction"]
    of_turn = [m for m in messages if m["turn_id"] == sent.json()["turn_id"] and m["id"] < summary["id"]]
    assert [m["role"] for m in of_turn] == ["user", "assistant", "tool", "assistant", "tool"], of_turn
    assert summary["origin"]["covered"] == 2

    await open_root(page, user.base, root_id)
    root = page.locator(".root-view")
    marker = root.locator(".msg.user.from-compaction")
    await expect(marker.locator(".msg-source")).to_have_text(
        "compacted here: everything before this turn's input is summarised for the model (2 messages of its "
        "history)")
    # The Turn's input and calls are above the marker, on screen, and not among what it summarises.
    shown = await root.locator(".msg, .coop-row").evaluate_all(
        """items => items.map((item) => item.classList.contains("coop-row") ? "calls"
           : item.classList.contains("from-compaction") ? "marker"
           : item.classList.contains("assistant") ? item.textContent.trim() : "input")""")
    assert shown == ["input", first.strip(), "input", "calls", "marker", "second answer"], shown
    await shoot(page, "compaction-mid-turn")
