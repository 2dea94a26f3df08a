"""The tree inbox in a real browser: it works from bounded summaries, and is re-read only when a
request may have changed; the card a human approves from always shows the whole request, read
from its own session."""

from __future__ import annotations

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from tests.ui.helpers import Tab, User, open_root, poll, rows, wait_result

expect = pytest.importorskip("playwright.async_api").expect

_PART = "#" * 500  # the agent's description: list_agents shows its first 500 characters
_TAIL = "x" * 490 + "END-MARKER"
COMMAND = _PART * 199 + _TAIL  # 100,000 characters
# Built from references to a tool result (call 1, list_agents): an Input holds at most 100,000 characters.
_LONG = "${1.agents.0.description}" * 199 + _TAIL
# A member that keeps working (a model message every 700 ms for half a minute) while the root waits.
_BUSY_KID = script(*[call(("list_agents", {}), delay_ms=700) for _ in range(40)], say("kid done"))


async def _kid_messages(runtime: Runtime, kid_id: str) -> int:
    found = await rows(runtime.db, "SELECT count(*) AS n FROM events WHERE session_id = %s AND kind = 'message'",
                       kid_id)
    return found[0]["n"]


async def test_the_card_shows_all_of_a_long_command_and_other_work_does_not_reread_requests(
        tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    assert len(COMMAND) == 100_000
    agent = await user.http.post("/api/v1/agents", json={
        "agent_id": "wary", "name": "Wary", "model": "canopy/scripted", "approval_mode": "ask", "description": _PART})
    assert agent.status_code == 201, agent.text
    text = script(call(create("kid", _BUSY_KID)), call(("list_agents", {})), call(("run_command", {"command": _LONG})),
                  say("denied"), task="run the long one")
    created = (await user.http.post("/api/v1/sessions", json={"agent_id": "wary", "input": text})).json()
    root_id = created["session"]["session_id"]

    reads: list[str] = []  # every GET of the API the page makes, in order
    page.on("request", lambda request: reads.append(request.url.split("?")[0])
            if request.method == "GET" and "/api/v1/" in request.url else None)
    await open_root(page, user.base, root_id)

    # The card holds the whole command, read from the root's own requests.
    card = page.locator(".root-view .request-card.approval")
    await expect(card.locator(".request-command")).to_contain_text("END-MARKER", timeout=30_000)
    shown = await card.locator(".request-command").text_content()
    assert shown == COMMAND, (len(shown or ""), (shown or "")[-20:])
    assert any(url.endswith(f"/sessions/{root_id}/requests") for url in reads), reads
    # The inbox names it from its summary: the first 500 characters and how long it is.
    inbox = page.locator(".root-view .inbox-summary")
    await expect(inbox).to_contain_text("/root wants to run for up to 120 s:")
    await expect(inbox).to_contain_text("100000 characters")
    assert len(await inbox.text_content() or "") < 1_000

    # The kid's model messages change no request: the page re-reads the tree's summary for them,
    # never a /requests list.
    summary = await poll(lambda: _kid(user, root_id), what="the kid")
    kid_id = summary["session_id"]
    await page.wait_for_timeout(1_000)  # the reads the card's arrival caused
    mark, before = len(reads), await _kid_messages(runtime, kid_id)
    await poll(lambda: _more_messages(runtime, kid_id, before + 4), timeout=30, what="four more kid messages")
    await page.wait_for_timeout(1_500)  # past the store's debounce (at most 600 ms) and its reads
    window = reads[mark:]
    kid_turns = await rows(runtime.db, "SELECT status FROM turns WHERE session_id = %s", kid_id)
    assert [t["status"] for t in kid_turns] == ["running"], "the kid ended inside the window"
    assert any(url.endswith(f"/trees/{root_id}") for url in window), window  # the page did follow the events
    assert [url for url in window if url.endswith("/requests")] == [], window

    # Denied from the card; the request's end is an event that re-reads the inbox, which empties.
    await card.locator("button", has_text="Deny").click()
    result = await wait_result(user, created["input"]["input_id"])
    assert result["output"] == "denied"
    await expect(page.locator(".root-view .inbox")).to_be_hidden()
    await expect(card).to_have_count(0)
    assert (await user.http.post(f"/api/v1/trees/{root_id}/stop")).status_code == 202  # the kid's work ends here


async def _kid(user: User, root_id: str) -> dict | None:
    members = (await user.http.get(f"/api/v1/trees/{root_id}")).json()["members"]
    return next((m for m in members if m["path"] == "/root/kid"), None)


async def _more_messages(runtime: Runtime, kid_id: str, at_least: int) -> bool:
    return await _kid_messages(runtime, kid_id) >= at_least
