"""Usage, budgets and interventions in a real browser: the state panel shows the tree's usage as the API
counts it; a tree stopped by its budget shows why, and raising the budget from the panel continues
it to the end; a steer and a human input to a child appear as interventions in the parent's view
(and the member's). Scenarios run on the scripted model (one on a model litellm has no price for, through real litellm);
the assertions read the durable facts back over HTTP."""

from __future__ import annotations

import re
import uuid

import pytest

from actors.scripted import call, create, say, script
from tests.actors.replay_server import ReplayServer, calls
from tests.actors.replay_server import say as replay_say
from tests.ui.helpers import Tab, User, create_root, get, member_at, open_root, poll, shoot, tree, wait_result

expect = pytest.importorskip("playwright.async_api").expect


async def test_the_state_panel_shows_the_trees_usage(tab: Tab, user: User) -> None:
    page = tab.page
    text = script(call(create("a", script(say("a done"))), create("b", script(say("b done")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})), say("both done"))
    created = await create_root(user, text, title="Usage")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])

    async def all_done() -> dict | None:
        summary = await tree(user, root_id)
        return summary if {m["turn_status"] for m in summary["members"]} == {"completed"} else None

    summary = await poll(all_done, what="every member completed")
    usage = summary["usage"]
    assert usage["model_calls"] == 5 and usage["tokens"] > 0
    await open_root(page, user.base, root_id)
    row = page.locator(".state-panel .state-usage")
    await expect(row).to_have_attribute("data-tokens", str(usage["tokens"]))
    await expect(row).to_have_attribute("data-model-calls", "5")
    await expect(row.locator(".usage-text")).to_contain_text(f"{usage['tokens']:,} tokens")
    await expect(row.locator(".usage-text")).to_contain_text(
        f"{usage['prompt_tokens']:,} in · {usage['completion_tokens']:,} out")
    await expect(row.locator(".usage-text")).to_contain_text("5 model calls")
    await expect(row.locator(".budget-meter")).to_have_count(0)  # no budget, no meter
    await expect(page.locator(".state-panel .state-stop-reason")).to_be_hidden()
    await shoot(page, "tree-usage")


async def test_a_budget_stop_shows_its_reason_and_raising_it_continues_the_tree(tab: Tab, user: User) -> None:
    page = tab.page
    work = script(*(call(("list_agents", {})) for _ in range(3)), say("first task done"), task="first task")
    text = script(call(create("a", work)),
                  call(("submit_input", {"target": "/root/a", "text": script(say("second task done"))})),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})), say("never"),
                  task="Two tasks for a")
    response = await user.http.post("/api/v1/sessions", json={"input": text, "title": "Budget",
                                                              "budget": {"max_model_calls": 5}})
    assert response.status_code == 201, response.text
    root_id = response.json()["session"]["session_id"]
    await open_root(page, user.base, root_id)

    async def stopped() -> dict | None:
        summary = await tree(user, root_id)
        ended = all(m["turn_status"] in ("completed", "failed", "cancelled") for m in summary["members"])
        return summary if summary["stopped"] and ended else None

    summary = await poll(stopped, what="the tree stopped by its budget")
    assert (summary["stop_reason"], summary["stop_detail"]["limit"]) == ("budget_exceeded", "model_calls")
    member = member_at(summary, "/root/a")
    assert member["pending_inputs"] == 1 and member["queue_paused"]

    panel = page.locator(".state-panel")
    reason = panel.locator(".state-stop-reason")
    await expect(reason).to_be_visible()
    await expect(reason).to_have_attribute("data-reason", "budget_exceeded")
    await expect(reason).to_contain_text("Stopped: the budget is used up (model calls")
    await expect(panel.locator('.chip[data-kind="stopped"]')).to_have_text("stopped: budget")
    meter = panel.locator('.budget-meter[data-limit="model_calls"]')
    await expect(meter).to_have_class("budget-meter reached")
    await expect(meter).to_contain_text("/ 5 model calls")
    await shoot(page, "budget-stopped")

    # Raise it from the panel and continue: a's queued second task runs to its end.
    await panel.locator("button.budget-btn", has_text="Raise budget").click()
    calls = panel.locator('.budget-form input[name="max_model_calls"]')
    await expect(calls).to_have_value("5")
    await calls.fill("50")
    await panel.locator(".budget-form button", has_text="Save and resume").click()
    await expect(reason).to_be_hidden()
    await expect(panel.locator(".state-note")).to_contain_text("Budget saved; continuing")

    async def second_done() -> dict | None:
        summary = await tree(user, root_id)
        a = member_at(summary, "/root/a")
        return summary if a["turn_status"] == "completed" and a["pending_inputs"] == 0 else None

    final = await poll(second_done, what="a's second task completed")
    assert not final["stopped"] and final["budget"]["max_model_calls"] == 50
    result = await get(user, f"/turns/{member_at(final, '/root/a')['turn_id']}/result")
    assert result["output"] == "second task done"
    await expect(panel.locator(".state-usage")).to_have_attribute("data-model-calls",
                                                                  str(final["usage"]["model_calls"]))
    await expect(meter).not_to_have_class("budget-meter reached")


async def test_a_steer_and_an_input_to_a_child_show_as_interventions_in_the_parents_view(tab: Tab,
                                                                                        user: User) -> None:
    page = tab.page
    text = script(call(create("a", script(say("a is done", delay_ms=20_000), task="slow work"))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("root done"), task="One slow child")
    created = await create_root(user, text, title="Interventions")
    root_id = created["session"]["session_id"]
    await open_root(page, user.base, root_id)

    async def running() -> str | None:
        a = next((m for m in (await tree(user, root_id))["members"] if m["path"] == "/root/a"), None)
        return a["session_id"] if a and a["activity"] == "running" else None

    a_id = await poll(running, what="/root/a running")
    await page.locator('.root-view .coop-row[data-tool="create_session"] .member-link', has_text="a").first.click()
    member = page.locator(f'.member-view[data-session-id="{a_id}"]')
    await expect(member).to_be_visible()
    steer = member.locator(".composer .btn.steer")
    await expect(steer).to_be_visible()
    await member.locator(".composer-input").fill("please focus on the summary")
    await steer.click()
    await expect(member.locator(".composer-status")).to_contain_text("Steer sent")
    await member.locator(".composer-input").fill("then list three risks")
    await member.locator(".composer button[type=submit]").click()
    await expect(member.locator(".composer-status")).to_contain_text("Queued")

    listed = await poll(lambda: _interventions(user, root_id, 2), what="two interventions recorded")
    assert [(i["action"], i["member_session_id"], i["payload"]["text"]) for i in listed] == [
        ("steer", a_id, "please focus on the summary"), ("input", a_id, "then list three risks")]

    # The parent's view (beside the member's tab): both, in order, each naming the member with a link.
    shown = page.locator(".root-view .intervention")
    await expect(shown).to_have_count(2)
    await expect(shown.nth(0)).to_have_attribute("data-action", "steer")
    await expect(shown.nth(0)).to_contain_text("You steered /root/a")
    await expect(shown.nth(0).locator(".intervention-quote")).to_have_text("please focus on the summary")
    await expect(shown.nth(1)).to_have_attribute("data-action", "input")
    await expect(shown.nth(1)).to_contain_text("You gave /root/a an input")
    await expect(shown.nth(1).locator(".intervention-quote")).to_have_text("then list three risks")
    await expect(shown.nth(0).locator(".member-link")).to_have_attribute("data-session-id", a_id)
    await shoot(page, "interventions-parent")

    # The member's own view shows them too, as done to this session.
    await shown.nth(1).locator(".member-link").click()
    mine = member.locator(".intervention.self")
    await expect(mine).to_have_count(2)
    await expect(mine.nth(0)).to_contain_text("You steered this session")
    await expect(mine.nth(1)).to_contain_text("You gave this session an input")


async def _interventions(user: User, session_id: str, count: int) -> list[dict] | None:
    listed = await get(user, f"/sessions/{session_id}/interventions")
    return listed if len(listed) >= count else None


async def test_a_cost_limit_stopped_by_a_model_with_no_price_says_so(tab: Tab, user: User,
                                                                     replay: ReplayServer) -> None:
    """An agent's own model that litellm has no price for: a cost limit cannot count its calls, so
    the tree stops after the first; the panel says why and names the fix (not "raise it")."""
    page = tab.page
    model = f"replay-unpriced-{uuid.uuid4().hex[:8]}"
    agent = await user.http.post("/api/v1/agents", json={
        "agent_id": f"house-{model}", "name": "House", "model": f"openai/{model}", "api_base": replay.base_url})
    assert agent.status_code == 201, agent.text
    replay.script(model, calls(("list_agents", {})), replay_say("never asked"))
    response = await user.http.post("/api/v1/sessions", json={
        "input": "Spend.", "title": "Unpriced", "agent_id": f"house-{model}", "budget": {"max_cost_usd": 1.0}})
    assert response.status_code == 201, response.text
    root_id = response.json()["session"]["session_id"]

    async def stopped() -> dict | None:
        summary = await tree(user, root_id)
        return summary if summary["stopped"] and summary["members"][0]["turn_status"] == "cancelled" else None

    summary = await poll(stopped, what="the tree stopped by its cost limit")
    assert summary["stop_detail"]["limit"] == "unpriced_calls" and summary["usage"]["unpriced_calls"] == 1
    assert len(replay.requests_for(model)) == 1
    await open_root(page, user.base, root_id)
    reason = page.locator(".state-panel .state-stop-reason")
    await expect(reason).to_contain_text("its cost cannot be counted: 1 model call to a model with no price")
    await expect(reason).to_contain_text("Remove its cost limit, then continue.")
    await expect(page.locator(".state-panel .state-usage .usage-text")).to_contain_text("(+ 1 call with no price)")
    # The cost meter is the limit that stopped the tree: reached, and it says what it could not count.
    meter = page.locator('.state-panel .budget-meter[data-limit="cost_usd"]')
    await expect(meter).to_have_class(re.compile(r"\breached\b"))
    await expect(meter).to_contain_text("+ 1 with no price")
