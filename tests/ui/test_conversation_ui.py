"""Conversation features in a real browser: origins and links across roots with the unread
marker, steering a running Turn, the "@" agent picker, an approval denied from its card (a
failed, expandable tool row), and archive refused while busy then allowed."""

from __future__ import annotations

import pytest

from actors.runtime import Runtime
from tests.ui.helpers import Tab, User, call, create_root, get, open_root, poll, rows, say, script, shoot, wait_result

expect = pytest.importorskip("playwright.async_api").expect


async def test_origins_across_roots_and_unread_marker(tab: Tab, user: User) -> None:
    page = tab.page
    other = script(say("B reporting", delay_ms=3000), task="an independent root")
    text = script(call(("create_session", {"name": "side", "description": other, "mode": "root"})),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("A saw B finish"), task="root A")
    created = await create_root(user, text, title="Root A")
    a_id = created["session"]["session_id"]
    await open_root(page, user.base, a_id)

    row = page.locator('.root-view .coop-row[data-tool="create_session"]')
    await expect(row).to_contain_text("created 1 root session:")
    link = row.locator(".member-link")
    await expect(link).to_have_text("side")
    b_id = await link.get_attribute("data-session-id")
    assert b_id and b_id != a_id
    assert (await get(user, f"/sessions/{b_id}"))["tree_id"] == b_id  # its own tree, not a child

    # B ends while A is shown: B is marked unread, A is not; activity and unread are separate.
    b_item = page.locator(f'.root-item[data-session-id="{b_id}"]')
    await expect(b_item.locator(".unread-dot")).to_be_visible(timeout=30_000)
    await expect(page.locator(f'.root-item[data-session-id="{a_id}"] .unread-dot')).to_have_count(0)
    await expect(page.locator(".root-item")).to_have_count(2)
    await shoot(page, "origins-unread")

    # The link opens B's own page; viewing it clears the marker.
    await link.click()
    await page.wait_for_url(f"**/#/s/{b_id}")
    b_view = page.locator(f'.workspace[data-root-id="{b_id}"] .root-view')
    await expect(b_view).to_be_visible()
    await expect(b_item.locator(".unread-dot")).to_have_count(0)
    source = b_view.locator(".msg.user .msg-source .member-link")
    await expect(source).to_have_text("from /root of another conversation")
    # B's input came from A's root: the source link goes back to A's page.
    await source.click()
    await page.wait_for_url(f"**/#/s/{a_id}")
    await expect(page.locator(f'.workspace[data-root-id="{a_id}"] .root-view')).to_be_visible()
    result = await wait_result(user, created["input"]["input_id"])
    assert result["output"] == "A saw B finish"


async def test_steer_and_agent_picker(tab: Tab, user: User) -> None:
    page = tab.page
    agent = await user.http.post("/api/v1/agents", json={
        "agent_id": "reviewer", "name": "Reviewer", "description": "Reviews drafts for tone",
        "model": "canopy/scripted"})
    assert agent.status_code == 201, agent.text
    text = script(call(("list_agents", {}), delay_ms=4000), say("done after the steer"), task="slow start")
    created = await create_root(user, text, title="Steer me")
    root_id = created["session"]["session_id"]
    await open_root(page, user.base, root_id)

    root = page.locator(".root-view")
    steer = root.locator(".composer .btn.steer")
    await expect(steer).to_be_visible()
    await root.locator(".composer-input").fill("please keep it brief")
    await steer.click()
    await expect(root.locator(".composer-status")).to_contain_text("Steer sent")
    await expect(root.locator(".composer-input")).to_have_value("")

    result = await wait_result(user, created["input"]["input_id"])
    assert result["output"] == "done after the steer"
    messages = await get(user, f"/sessions/{root_id}/messages")
    steers = [m for m in messages if m["role"] == "user" and m["origin"].get("kind") == "steer"]
    assert len(steers) == 1 and "please keep it brief" in steers[0]["content"]
    shown = root.locator(".msg.user.from-steer")
    await expect(shown.locator(".msg-source")).to_have_text("steer")
    await expect(shown.locator(".msg-text")).to_have_text("please keep it brief")
    await expect(steer).to_be_hidden()  # nothing runs any more

    # "@" lists the agents the user may run, searchable by name, description or id.
    box = root.locator(".composer-input")
    for query in ("@Rev", "@tone", "@agent:review"):
        await box.fill("")
        await box.press_sequentially(f"ask {query}")
        option = root.locator(".agent-picker .agent-option")
        await expect(option).to_have_count(1)
        await expect(option.locator(".agent-name")).to_have_text("Reviewer")
    await box.press("Enter")
    await expect(box).to_have_value("ask @agent:reviewer ")
    await expect(root.locator(".agent-picker")).to_be_hidden()
    await box.press_sequentially("@zzz")
    await expect(root.locator(".agent-picker .agent-empty")).to_have_text("No agent matches.")
    await box.press("Escape")
    await shoot(page, "steer")

    # The title is editable in place (PATCH /sessions/{id}); the list follows.
    await page.locator(".main-head button", has_text="Rename").click()
    await page.locator(".main-head .title-input").fill("Steered and renamed")
    await page.locator(".main-head .title-input").press("Enter")
    await expect(page.locator(".main-head .root-title")).to_have_text("Steered and renamed")
    assert (await get(user, f"/sessions/{root_id}"))["title"] == "Steered and renamed"
    await expect(page.locator(f'.root-item[data-session-id="{root_id}"] .root-title')).to_have_text(
        "Steered and renamed")


async def test_approval_denied_and_archive(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    agent = await user.http.post("/api/v1/agents", json={
        "agent_id": "careful", "name": "Careful", "model": "canopy/scripted", "approval_mode": "ask"})
    assert agent.status_code == 201, agent.text
    text = script(call(("run_command", {"command": "rm -rf ./build"})), say("the command was refused"),
                  task="clean up")
    response = await user.http.post("/api/v1/sessions", json={"agent_id": "careful", "input": text,
                                                               "title": "Needs an approval"})
    assert response.status_code == 201, response.text
    created = response.json()
    root_id = created["session"]["session_id"]
    await open_root(page, user.base, root_id)

    card = page.locator(".root-view .request-card.approval")
    await expect(card.locator(".request-command")).to_have_text("rm -rf ./build", timeout=30_000)
    await expect(page.locator(".root-view .inbox-summary")).to_contain_text("/root wants to run: rm -rf ./build")
    await expect(page.locator(f'.root-item[data-session-id="{root_id}"]')).to_have_attribute(
        "data-activity", "waiting_approval", timeout=15_000)
    await expect(page.locator(f'.root-item[data-session-id="{root_id}"] .badge')).to_have_text("needs approval")

    # Archive is refused while the tree waits for a human, with the reason.
    await page.locator(f'.root-item[data-session-id="{root_id}"] .archive-btn').click()
    await expect(page.locator(".toast.error")).to_contain_text("cannot be archived yet")
    await shoot(page, "approval")

    await card.locator("button", has_text="Deny").click()
    await expect(card).to_be_hidden()
    result = await wait_result(user, created["input"]["input_id"])
    assert result["output"] == "the command was refused"
    answered = await rows(runtime.db, "SELECT status, response FROM requests WHERE tree_id = %s", root_id)
    assert [(r["status"], r["response"]) for r in answered] == [("answered", {"decision": "deny"})]

    # The denied call is a failed row whose details expand.
    failed = page.locator('.root-view details.coop-row[data-tool="run_command"]')
    await expect(failed).to_have_attribute("data-state", "failed")
    await expect(failed.locator("summary")).to_contain_text("could not run")
    await failed.locator("summary").click()
    await expect(failed.locator(".coop-error")).to_be_visible()
    assert "error" in (await get(user, f"/sessions/{root_id}/messages"))[2]["content"]

    # Once idle, archive works: the root leaves the list (and the API's list), nothing is deleted.
    async def idle() -> bool:
        return (await get(user, f"/sessions/{root_id}"))["activity"] == "idle"

    await poll(idle, what="root idle")
    await page.locator(f'.root-item[data-session-id="{root_id}"] .archive-btn').click()
    await expect(page.locator(f'.root-item[data-session-id="{root_id}"]')).to_have_count(0)
    assert root_id not in [s["session_id"] for s in await get(user, "/sessions")]
    assert (await get(user, f"/sessions/{root_id}"))["status"] == "archived"
