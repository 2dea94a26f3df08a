"""Cooperation scenarios in a real browser: fan-out from the UI, Stop all / Continue, a member's
question answered from the inbox. Each scenario is scripted through the scripted model, and the
assertions read the durable facts back over HTTP or from the database where they can."""

from __future__ import annotations

import re

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from tests.actors.helpers import peak_concurrent_runs
from tests.ui.helpers import Tab, User, create_root, get, member_at, open_root, poll, rows, shoot, tree, wait_result

expect = pytest.importorskip("playwright.async_api").expect

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


async def chip_counts(page) -> dict[str, int]:
    """The state panel's chips as {kind: count} (and the member count)."""
    return await page.evaluate("""() => {
        const panel = document.querySelector('.workspace:not([hidden]) .state-panel');
        const counts = {members: Number(panel?.querySelector('.state-count')?.dataset.members ?? -1)};
        for (const chip of panel?.querySelectorAll('.chip[data-kind]') ?? []) {
            counts[chip.dataset.kind] = Number(chip.dataset.count ?? 1);
        }
        return counts;
    }""")


async def test_six_children_created_from_the_ui(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    names = [f"w{i}" for i in range(6)]
    text = script(
        call(*(create(n, script(say(f"{n} finished its part", delay_ms=1200), task=f"work {n}")) for n in names)),
        call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(6)]})),
        say("all six workers are done"),
        task="Fan out to six workers",
    )
    await page.goto(f"{user.base}/#/new")
    await page.locator(".new-page .composer-input").fill(text)
    await page.locator(".new-page .composer button[type=submit]").click()
    await page.wait_for_url(re.compile(rf"#/s/{UUID}$"))
    root_id = page.url.rsplit("/", 1)[-1]
    await expect(page.locator(f'.root-item[data-session-id="{root_id}"]')).to_be_visible()

    # Sample the live state panel until the whole tree is done: never more than 4 running.
    samples: list[dict[str, int]] = []

    async def finished() -> bool:
        counts = await chip_counts(page)
        samples.append(counts)
        busy = any(counts.get(kind) for kind in ("running", "queued", "waiting", "attention", "stopping"))
        return counts["members"] == 7 and not busy

    await poll(finished, timeout=90, every=0.15, what="seven idle members in the state panel")
    assert max(s.get("running", 0) for s in samples) <= 4, samples
    assert any(s.get("running", 0) >= 2 for s in samples), "the panel never showed the children running"

    # Durable facts: 7 members, every Turn completed, the slot limit held.
    summary = await tree(user, root_id)
    assert len(summary["members"]) == 7
    assert {m["turn_status"] for m in summary["members"]} == {"completed"}
    root = await get(user, f"/sessions/{root_id}")
    result = await get(user, f"/turns/{root['turn_id']}/result")
    assert result["output"] == "all six workers are done"
    assert 2 <= await peak_concurrent_runs(runtime.db, root_id) <= 4

    # The conversation shows one compact row per kind of cooperation call, each member a link.
    created = page.locator('.root-view .coop-row[data-tool="create_session"]')
    await expect(created).to_have_count(1)
    await expect(created).to_contain_text("created 6 sessions")
    links = created.locator(".member-link")
    await expect(links).to_have_count(6)
    by_path = {m["path"]: m["session_id"] for m in summary["members"]}
    assert [await link.text_content() for link in await links.all()] == names
    assert [await link.get_attribute("data-session-id") for link in await links.all()] == \
        [by_path[f"/root/{n}"] for n in names]
    waited = page.locator('.root-view .coop-row[data-tool="wait_inputs"]')
    await expect(waited).to_contain_text("waited for 6 tasks")
    await expect(waited.locator(".member-link")).to_have_count(6)

    # Clicking a member opens its tab with its own conversation.
    await links.nth(3).click()
    view = page.locator(f'.side-pane .member-view[data-session-id="{by_path["/root/w3"]}"]')
    await expect(view).to_be_visible()
    await expect(view.locator(".view-path")).to_have_text("/root/w3")
    await expect(view.locator(".msg.assistant")).to_contain_text("w3 finished its part")
    await expect(view.locator(".msg.user .msg-source")).to_contain_text("from /root")
    await expect(page.locator(".tab.active")).to_contain_text("w3")
    await shoot(page, "six-children")


async def test_stop_all_then_continue(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    text = script(
        call(create("a", script(say("a", delay_ms=30000))), create("b", script(say("b", delay_ms=30000)))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
        say("never"),
        task="Two slow workers",
    )
    created = await create_root(user, text, title="Stop all, then continue")
    root_id = created["session"]["session_id"]
    await open_root(page, user.base, root_id)
    await poll(lambda: _running_and_waiting(page), timeout=60, what="two members running, the root waiting")

    # A human's input to a busy member is queued (FIFO), typed in the member's own tab.
    summary = await tree(user, root_id)
    a_id = member_at(summary, "/root/a")["session_id"]
    await page.locator('.root-view .coop-row[data-tool="create_session"] .member-link', has_text="a").first.click()
    member = page.locator(f'.member-view[data-session-id="{a_id}"]')
    await member.locator(".composer-input").fill(script(say("second task done"), task="a second task"))
    await member.locator(".composer button[type=submit]").click()
    await expect(member.locator(".composer-status")).to_contain_text("Queued")

    # Stop all: every member ends cancelled, the queued input stays pending (paused).
    stop = page.locator(".state-panel button", has_text="Stop all")
    await stop.click()
    continue_button = page.locator(".state-panel button", has_text="Continue")
    await expect(continue_button).to_be_visible(timeout=30_000)
    await expect(stop).to_be_hidden()

    async def all_cancelled() -> dict | None:
        state = await tree(user, root_id)
        ended = all(m["turn_status"] == "cancelled" and m["activity"] == "idle" for m in state["members"])
        return state if ended else None

    state = await poll(all_cancelled, timeout=30, what="every member cancelled and idle")
    assert member_at(state, "/root/a")["pending_inputs"] == 1 and member_at(state, "/root/a")["queue_paused"]
    pending = await rows(runtime.db, "SELECT input_id FROM inputs WHERE session_id = %s AND status = 'pending'",
                         a_id)
    assert len(pending) == 1
    await expect(member.locator(".queue-note")).to_contain_text("1 input queued (paused by Stop all)")

    waited = page.locator('.root-view .coop-row[data-tool="wait_inputs"]')
    await expect(waited).to_contain_text("stopped waiting for 2 tasks")
    await expect(page.locator(".root-view .turn-end.cancelled")).to_have_text("Turn cancelled")
    await page.locator(".state-panel .state-summary").click()
    nodes = page.locator(".coop-list .coop-node")
    await expect(nodes).to_have_count(3)
    await expect(page.locator('.coop-list .badge[data-turn-status="cancelled"]')).to_have_count(3)
    await shoot(page, "stop-all")

    # Continue refused with 409 (a Turn still ending): the panel explains, nothing breaks.
    await page.route("**/continue", lambda route: route.fulfill(
        status=409, json={"detail": "tree still has unfinished turns"}))
    await continue_button.click()
    await expect(page.locator(".state-panel .state-note")).to_contain_text("Not yet")
    await page.unroute("**/continue")

    # Continue runs the queued input; the cancelled Turns stay cancelled.
    await continue_button.click()
    second = await wait_result(user, str(pending[0]["input_id"]), timeout=60)
    assert (second["status"], second["output"]) == ("completed", "second task done")
    statuses = await rows(runtime.db, "SELECT t.status FROM turns t JOIN sessions s USING (session_id) "
                          "WHERE s.tree_id = %s AND t.turn_id <> %s", root_id, second["turn_id"])
    assert [r["status"] for r in statuses] == ["cancelled"] * 3
    await page.locator(f'.tab-select[data-key="{a_id}"]').click()
    await expect(member.locator(".msg.assistant").last).to_have_text("second task done")
    await expect(continue_button).to_be_hidden()
    await shoot(page, "continued")


async def _running_and_waiting(page) -> bool:
    counts = await chip_counts(page)
    return counts.get("running", 0) == 2 and counts.get("waiting", 0) == 1


async def test_member_questions_answered_from_the_inbox(tab: Tab, user: User) -> None:
    page = tab.page

    def asker(question: str) -> str:
        return script(call(("ask_user", {"question": question})), say("answer: $${0.answer}"), task="ask the human")

    text = script(call(create("asker", asker("Which colour should the shed be?")),
                       create("painter", asker("Gloss or matt?"))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
                  say("root got ${2.results.0.output} and ${2.results.1.output}"), task="Paint the shed")
    created = await create_root(user, text, title="Questions for the human")
    root_id = created["session"]["session_id"]
    await open_root(page, user.base, root_id)

    # Two pending questions: the inbox summarises them and opens a list.
    inbox = page.locator(".root-view .inbox .inbox-summary")
    await expect(inbox).to_contain_text("2 questions waiting for you", timeout=60_000)
    requests = {r["path"]: r for r in await get(user, f"/trees/{root_id}/requests")}
    assert sorted(requests) == ["/root/asker", "/root/painter"]
    assert {r["kind"] for r in requests.values()} == {"question"}
    await expect(page.locator('.root-item[data-activity="waiting_cooperation"]')).to_be_visible()
    # The list shows the tree's attention: three members waiting, two of them for you.
    waiting = page.locator(f'.root-item[data-session-id="{root_id}"] .root-attention .chip')
    await expect(waiting).to_have_text(["3 waiting"])
    await expect(waiting).to_have_attribute("data-kind", "attention")
    await inbox.click()
    items = page.locator(".root-view .inbox-list .inbox-item")
    await expect(items).to_have_count(2)  # in the order the questions were asked
    await shoot(page, "inbox")

    # An item opens the member's tab focused on its request card.
    await items.filter(has_text="/root/asker").click()
    asker_request = requests["/root/asker"]
    card = page.locator(f'.member-view[data-session-id="{asker_request["session_id"]}"] '
                        f'#request-{asker_request["id"]}')
    await expect(card).to_be_visible()
    assert await page.evaluate("() => Boolean(document.activeElement?.closest('.request-card'))")
    await expect(page.locator(f'.tab[data-key="{asker_request["session_id"]}"] .tab-badge')).to_have_text("1")

    # A failed answer (503) keeps the text and offers a retry under the same Idempotency-Key.
    answers = []
    page.on("request", lambda request: answers.append(request) if request.url.endswith("/answer") else None)
    await page.route("**/answer", lambda route: route.fulfill(status=503, json={"detail": "try again later"}))
    await card.locator(".request-answer").fill("green")
    await card.locator("button", has_text="Answer").click()
    await expect(card.locator(".request-error")).to_contain_text("try again later")
    await expect(card.locator(".request-answer")).to_have_value("green")
    await shoot(page, "answer-retry")
    await page.unroute("**/answer")
    await card.locator("button", has_text="Retry").click()
    await expect(card).to_be_hidden()
    keys = [(await request.all_headers()).get("idempotency-key") for request in answers]
    assert len(keys) == 2 and keys[0] and keys[0] == keys[1], keys

    # One question left: the inbox names it and a click goes straight to its card.
    await expect(inbox).to_contain_text("/root/painter asks: Gloss or matt?")
    await inbox.click()
    painter_request = requests["/root/painter"]
    card = page.locator(f'.member-view[data-session-id="{painter_request["session_id"]}"] '
                        f'#request-{painter_request["id"]}')
    await expect(card).to_be_visible()
    await card.locator(".request-answer").fill("matt")
    await card.locator(".request-answer").press("Enter")
    await expect(card).to_be_hidden()

    result = await wait_result(user, created["input"]["input_id"], timeout=60)
    assert result["output"] == "root got answer: green and answer: matt", (result["status"], result["error"])
    assert await get(user, f"/trees/{root_id}/requests") == []
    await expect(page.locator(".root-view .inbox")).to_be_hidden()
    await expect(page.locator(".root-view .msg.assistant").last).to_have_text(result["output"])
