"""A session's schedules and a compaction marker in a real browser: a schedule added, listed and
deleted from the conversation (read back from the API), and a compacted history shown with its
"compacted here" divider while every original message stays on screen."""

from __future__ import annotations

import pytest

from actors.scripted import say, script
from tests.ui.helpers import Tab, User, create_root, get, open_root, poll, shoot, wait_result

expect = pytest.importorskip("playwright.async_api").expect


async def test_add_and_delete_a_schedule(tab: Tab, user: User) -> None:
    page = tab.page
    created = await create_root(user, script(say("hello")), title="Scheduled")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])
    await open_root(page, user.base, root_id)
    panel = page.locator(".root-view details.schedules")
    await panel.locator("summary").click()
    await panel.locator(".schedule-every").fill("3600")
    await panel.locator(".schedule-form .schedule-text").fill("check the build")
    await panel.locator(".schedule-form button[type=submit]").click()
    await expect(panel.locator(".schedule")).to_have_count(1)
    await expect(panel.locator(".schedule .schedule-rule")).to_have_text("every 3600 s")
    [made] = await get(user, f"/sessions/{root_id}/schedules")
    assert made["every_seconds"] == 3600 and made["text"] == "check the build"
    await shoot(page, "schedules")
    await panel.locator(".schedule .link-btn", has_text="Delete").click()
    await expect(panel.locator(".schedule")).to_have_count(0)
    assert await get(user, f"/sessions/{root_id}/schedules") == []


async def test_a_compacted_history_shows_its_marker_and_every_message(tab: Tab, user: User) -> None:
    page = tab.page
    # Long enough that a summary (the scripted model's is a line) is at most half of what it stands for.
    first = "first answer, " + "with the details of the plan " * 10
    created = await create_root(user, script(say(first)), title="Compacted")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])
    response = await user.http.post(f"/api/v1/sessions/{root_id}/compact")
    assert response.status_code == 202, response.text
    sent = await user.http.post(f"/api/v1/sessions/{root_id}/inputs", json={"text": script(say("second answer"))})
    await wait_result(user, sent.json()["input_id"])

    async def summarised() -> list[dict[str, object]]:
        messages = await get(user, f"/sessions/{root_id}/messages")
        return [m for m in messages if m["origin"].get("kind") == "compaction"]

    [summary] = await poll(summarised)
    assert summary["origin"]["covered"] == 2
    await open_root(page, user.base, root_id)
    root = page.locator(".root-view")
    marker = root.locator(".msg.user.from-compaction")
    await expect(marker).to_have_count(1)
    await expect(marker.locator(".msg-source")).to_contain_text("compacted here")
    await expect(root.locator(".msg.assistant")).to_have_count(2)  # both answers stay on screen
    await expect(root.locator(".msg.assistant").first).to_have_text(first.strip())
    await shoot(page, "compaction-marker")
