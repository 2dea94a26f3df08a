"""Views in a real browser: member tabs (drafts, scroll, reuse, maximize), a 107-member tree,
layout at four widths in both themes, one SSE stream per tree (from the summary's cursor, resumed
with Last-Event-ID),
the API key prompt, and the pure modules (SSE parser, cooperation rows) in the page itself."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from tests.ui.helpers import (
    Tab,
    User,
    create_root,
    horizontal_overflow,
    member_at,
    open_root,
    open_tab,
    rows,
    seed_tree,
    shoot,
    sign_in_by_link,
    tree,
    wait_result,
)

if TYPE_CHECKING:
    from playwright.async_api import Browser, Request

expect = pytest.importorskip("playwright.async_api").expect

LONG_REPORT = "\n".join(f"line {i:03d}: " + "the quick brown fox jumps over the lazy dog " * 2 for i in range(120))


async def two_reports(user: User, title: str = "Two long reports") -> tuple[str, dict[str, str]]:
    """A finished tree: the root and two members, each member with a long reply."""
    text = script(
        call(create("left", script(say(f"left report\n{LONG_REPORT}"), task="report left")),
             create("right", script(say(f"right report\n{LONG_REPORT}"), task="report right"))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
        say("both reported"),
        task="Collect two reports",
    )
    created = await create_root(user, text, title=title)
    await wait_result(user, created["input"]["input_id"], timeout=60)
    root_id = created["session"]["session_id"]
    summary = await tree(user, root_id)
    return root_id, {m["name"]: m["session_id"] for m in summary["members"]}


def view(page, session_id: str):
    return page.locator(f'.session-view[data-session-id="{session_id}"]')


async def open_member(page, name: str) -> None:
    await page.locator('.root-view .coop-row[data-tool="create_session"] .member-link', has_text=name).first.click()


async def test_member_tabs_keep_drafts_and_scroll(tab: Tab, user: User) -> None:
    page = tab.page
    root_id, ids = await two_reports(user)
    await open_root(page, user.base, root_id)
    await view(page, root_id).locator(".composer-input").fill("root draft")

    await open_member(page, "left")
    left = view(page, ids["left"])
    await expect(left.locator(".msg.assistant")).to_contain_text("line 119")
    await left.locator(".composer-input").fill("draft for left")
    await left.locator(".view-scroll").evaluate("el => { el.scrollTop = 420; }")

    await open_member(page, "right")
    right = view(page, ids["right"])
    await expect(right.locator(".msg.assistant")).to_contain_text("line 119")
    await expect(left).to_be_hidden()
    await right.locator(".composer-input").fill("draft for right")
    await right.locator(".view-scroll").evaluate("el => { el.scrollTop = 180; }")

    for _ in range(2):  # back and forth: each tab has its own draft and scroll position
        await page.locator(f'.tab-select[data-key="{ids["left"]}"]').click()
        await expect(left.locator(".composer-input")).to_have_value("draft for left")
        assert abs(await left.locator(".view-scroll").evaluate("el => el.scrollTop") - 420) <= 2
        await page.locator(f'.tab-select[data-key="{ids["right"]}"]').click()
        await expect(right.locator(".composer-input")).to_have_value("draft for right")
        assert abs(await right.locator(".view-scroll").evaluate("el => el.scrollTop") - 180) <= 2

    # Reopening a member reuses its tab (same view, same draft).
    await open_member(page, "left")
    await expect(page.locator(".side-pane .tab.member")).to_have_count(2)
    await expect(page.locator(".tab.active")).to_have_attribute("data-key", ids["left"])
    await expect(left.locator(".composer-input")).to_have_value("draft for left")
    await shoot(page, "member-tabs")

    # Maximize: the root becomes the first, non-closable tab; everything is kept.
    await page.locator(".side-head .tab-tools .icon-btn").click()
    first = page.locator(".side-pane .tab").first
    await expect(first).to_have_attribute("data-key", "root")
    await expect(first.locator(".tab-close")).to_have_count(0)
    await expect(page.locator(".main-pane")).to_be_hidden()
    await expect(page.locator(".side-pane .state-panel")).to_be_visible()
    await first.locator(".tab-select").click()
    await expect(view(page, root_id).locator(".composer-input")).to_have_value("root draft")
    await shoot(page, "maximized")
    await page.locator(f'.tab-select[data-key="{ids["left"]}"]').click()
    assert abs(await left.locator(".view-scroll").evaluate("el => el.scrollTop") - 420) <= 2
    await page.locator(".side-head .tab-tools .icon-btn").click()
    await expect(page.locator(".main-pane")).to_be_visible()
    await expect(page.locator('.side-pane .tab[data-key="root"]')).to_have_count(0)
    await expect(view(page, root_id).locator(".composer-input")).to_have_value("root draft")

    # Closing a tab and reopening it starts a new view; the draft is kept per session.
    await page.locator(f'.tab[data-key="{ids["left"]}"] .tab-close').click()
    await expect(page.locator(".side-pane .tab.member")).to_have_count(1)
    await open_member(page, "left")
    await expect(view(page, ids["left"]).locator(".composer-input")).to_have_value("draft for left")


async def test_a_107_member_tree_renders_completely(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    root_id, made = await seed_tree(runtime, user.scope, children=10, grandchildren=96)
    assert len(made) == 107
    await open_root(page, user.base, root_id)
    await expect(page.locator(".state-panel .state-count")).to_have_text("107 members")
    await page.evaluate("""() => {
        window.__longTasks = [];
        new PerformanceObserver((list) => {
            for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
        }).observe({type: 'longtask'});
    }""")

    started = time.monotonic()
    await page.locator(".state-panel .state-summary").click()
    nodes = page.locator(".coop-list .coop-node")
    await expect(nodes).to_have_count(107)
    rendered = time.monotonic() - started
    shown = await nodes.evaluate_all("els => els.map(el => el.dataset.sessionId)")
    durable = await rows(runtime.db, "SELECT session_id::text AS id FROM sessions WHERE tree_id = %s", root_id)
    assert sorted(shown) == sorted(r["id"] for r in durable)
    # Hierarchy: every member after its parent, indented by depth.
    summary = await tree(user, root_id)
    position = {sid: i for i, sid in enumerate(shown)}
    assert all(position[m["parent_id"]] < position[m["session_id"]] for m in summary["members"] if m["parent_id"])
    assert await nodes.nth(1).get_attribute("aria-level") == "2"
    assert await nodes.nth(2).get_attribute("aria-level") == "3"

    # Scrolling to the end and opening the last member stays quick.
    scroller = page.locator(".coop-list-scroll")
    for fraction in (0.25, 0.5, 0.75, 1.0):
        await scroller.evaluate(f"el => {{ el.scrollTop = el.scrollHeight * {fraction}; }}")
        await page.wait_for_timeout(50)
    last = nodes.last
    await expect(last).to_be_in_viewport()
    started = time.monotonic()
    await last.locator("button").click()
    await expect(view(page, shown[-1])).to_be_visible()
    opened = time.monotonic() - started
    long_tasks = await page.evaluate("() => window.__longTasks")
    assert rendered < 3.0 and opened < 3.0, (rendered, opened)
    assert max(long_tasks, default=0) < 400, long_tasks
    await page.locator(".tab-select", has_text="Cooperation").click()
    await shoot(page, "tree-107")


async def test_layout_has_no_horizontal_overflow(browser: Browser, user: User, runtime: Runtime) -> None:
    long_name = "n" * 64  # the longest local name
    unbroken = "x" * 400
    text = script(
        call(create(long_name, script(say(f"unbroken {unbroken}"), task=f"task {unbroken}")),
             create("short", script(say("done")))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}"]})),
        say(f"root says {unbroken}"),
        task="Layout check",
    )
    created = await create_root(user, text, title="An extremely long conversation title " * 6)
    await wait_result(user, created["input"]["input_id"], timeout=60)
    root_id = created["session"]["session_id"]
    long_id = member_at(await tree(user, root_id), f"/root/{long_name}")["session_id"]

    for theme in ("light", "dark"):
        opened = await open_tab(browser, user, width=1280, height=800, theme=theme)
        page = opened.page
        try:
            await open_root(page, user.base, root_id)
            assert await page.evaluate("() => document.documentElement.dataset.theme") == theme
            await page.locator(".state-panel .state-summary").click()
            await expect(page.locator(".coop-list .coop-node")).to_have_count(3)
            await page.locator('.root-view .coop-row[data-tool="create_session"] .member-link').first.click()
            await expect(view(page, long_id)).to_be_visible()
            for width in (375, 768, 1280, 2200):
                await page.set_viewport_size({"width": width, "height": 800})
                await page.wait_for_timeout(150)
                assert await horizontal_overflow(page) == [], (theme, width, "member tab open")
                title = page.locator(".main-head .root-title").first
                if await title.is_visible():
                    assert await title.evaluate("el => el.scrollWidth > el.clientWidth"), "title not truncated"
                    assert await title.evaluate("el => getComputedStyle(el).textOverflow") == "ellipsis"
                list_title = page.locator(".root-item .root-title").first
                if await list_title.is_visible():
                    assert await list_title.evaluate("el => el.scrollWidth > el.clientWidth")
                back = page.locator(".side-head .back-btn")
                if await back.is_visible():  # narrow: the tab covers the conversation; go back to it
                    await back.click()
                    assert await horizontal_overflow(page) == [], (theme, width, "conversation")
                    await page.locator('.root-view .coop-row[data-tool="create_session"] .member-link').first.click()
            await page.set_viewport_size({"width": 1280, "height": 800})
            await shoot(page, f"layout-{theme}", widths=(1280, 375))
        finally:
            await opened.context.close()
        assert not opened.errors, opened.errors


async def test_one_event_stream_per_tree(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    streams: list[Request] = []
    page.on("request", lambda request: streams.append(request) if "/events" in request.url else None)
    root_id, ids = await two_reports(user, title="Watched by three views")
    await open_root(page, user.base, root_id)
    await open_member(page, "left")
    await open_member(page, "right")
    await expect(view(page, ids["right"])).to_be_visible()
    await page.wait_for_timeout(1500)
    # The stream starts after the summary the page read: no history is replayed.
    assert len(streams) == 1, [r.url for r in streams]
    url, _, after = streams[0].url.partition("?after=")
    assert url == f"{user.base}/api/v1/trees/{root_id}/events"
    assert int(after) >= max(r["cursor"] for r in await rows(
        runtime.db, "SELECT cursor FROM events WHERE tree_id = %s", root_id))
    assert await page.evaluate(f"() => window.canopy.store.tree('{root_id}').cursor") == ""
    assert (await streams[0].all_headers()).get("authorization") == f"Bearer {user.key}"

    # A hidden tab keeps receiving: new work for "left" shows up in its (background) view.
    response = await user.http.post(f"/api/v1/sessions/{ids['left']}/inputs",
                                    json={"text": script(say("late news for left"), task="more")})
    assert response.status_code == 202, response.text
    await wait_result(user, response.json()["input_id"])
    left = view(page, ids["left"])
    await expect(left).to_be_hidden()
    await expect(left.locator(".msg.assistant").last).to_have_text("late news for left")

    # After a drop the stream resumes from its last cursor with Last-Event-ID.
    cursor = await page.evaluate(f"() => window.canopy.store.tree('{root_id}').cursor")
    assert cursor and int(cursor) > 0
    await page.evaluate(f"() => window.canopy.store.tree('{root_id}').reconnect()")
    for _ in range(50):
        if len(streams) > 1:
            break
        await asyncio.sleep(0.1)
    assert len(streams) == 2, [r.url for r in streams]
    assert (await streams[1].all_headers()).get("last-event-id") == cursor

    # Still one stream: navigating to another root closes this tree's stream and opens that one's.
    other = await create_root(user, script(say("hello")), title="Another root")
    await page.goto(f"{user.base}/#/s/{other['session']['session_id']}")

    def trees_opened() -> set[str]:
        return {r.url.split("/trees/")[1].split("/")[0] for r in streams}

    for _ in range(150):  # the other tree's stream opens once its page has loaded
        if len(trees_opened()) > 1:
            break
        await asyncio.sleep(0.1)
    assert trees_opened() == {root_id, other["session"]["session_id"]}


async def test_an_archived_trees_stream_ends_for_good(tab: Tab, user: User) -> None:
    """The server answers the stream of an archived tree with nothing left to send with 204: the
    page's stream stops there and does not come back (any other answer is a reconnect), and the
    page stops polling the tree (it did every 4 s while its stream was down)."""
    page = tab.page
    requests: list[Request] = []
    page.on("request", lambda request: requests.append(request) if "/api/v1/" in request.url else None)
    created = await create_root(user, script(say("all done")), title="Done and archived")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])
    assert (await user.http.post(f"/api/v1/sessions/{root_id}/archive")).status_code == 200
    await open_root(page, user.base, root_id)
    await page.wait_for_function(f"() => window.canopy.store.tree('{root_id}').connection === 'ended'")
    await page.wait_for_timeout(500)  # the reads the page made as the stream ended
    seen = len(requests)
    # Past the stream's reconnection delays (0.5 s, then doubling) and the store's polling while
    # its stream is down (every 4 s): an archived tree changes no more, so nothing is asked again.
    await page.wait_for_timeout(5000)
    assert len([r for r in requests if "/events" in r.url]) == 1, [r.url for r in requests]
    assert [r.url for r in requests[seen:] if root_id in r.url] == []
    await expect(page.locator(".msg.assistant").last).to_have_text("all done")  # the history stays readable


async def test_api_key_prompt(browser: Browser, user: User) -> None:
    opened = await open_tab(browser, user, key=False)
    page = opened.page
    try:
        await page.goto(f"{user.base}/")
        dialog = page.locator("#login-dialog")
        await expect(dialog).to_be_visible()
        await page.locator("#login-key").fill("cnp_not-a-key")
        await page.locator("#login-submit").click()
        await expect(page.locator("#login-error")).to_contain_text("not accepted")
        await page.locator("#login-key").fill(user.key)
        await page.locator("#login-submit").click()
        await expect(dialog).to_be_hidden()
        await expect(page.locator(".sidebar .new-session")).to_be_visible()
        assert await page.evaluate("() => localStorage.getItem('canopy:api-key')") == user.key
        # The sidebar says whose key it is (the user and app it reaches).
        await expect(page.locator(".sidebar .sidebar-identity")).to_have_text(
            f"{user.scope.user_id} · {user.scope.app_id}")
    finally:
        await opened.context.close()

    # A link carrying the key (#key=...) scrubs the key from the address and asks first, naming whose
    # key it is: a link may carry anyone's, and what is typed goes to its user. Declined, nothing is
    # kept and the page asks for a key as without the link; agreed, it signs in.
    opened = await open_tab(browser, user, key=False)
    page = opened.page
    try:
        await page.goto(f"{user.base}/#key={user.key}")
        await expect(page.locator("#link-key-who")).to_have_text(
            f"user {user.scope.user_id} of app {user.scope.app_id}")
        assert user.key not in page.url
        assert await page.evaluate("() => localStorage.getItem('canopy:api-key')") is None
        await page.locator("#link-key-decline").click()
        await expect(page.locator("#login-dialog")).to_be_visible()
        assert await page.evaluate("() => localStorage.getItem('canopy:api-key')") is None
    finally:
        await opened.context.close()
    opened = await open_tab(browser, user, key=False)
    page = opened.page
    try:
        await sign_in_by_link(page, user.base, user.key)
        await expect(page.locator(".sidebar .sidebar-identity")).to_have_text(
            f"{user.scope.user_id} · {user.scope.app_id}")
    finally:
        await opened.context.close()

    # A link carrying another key does not replace a saved one: it would sign its reader into the
    # link maker's account, where their prompts and files would go. The fragment is scrubbed all the same.
    opened = await open_tab(browser, user)
    page = opened.page
    try:
        await page.goto(f"{user.base}/#key=ck_someone_else")
        await expect(page.locator(".sidebar .new-session")).to_be_visible()
        assert "someone_else" not in page.url
        assert await page.evaluate("() => localStorage.getItem('canopy:api-key')") == user.key
    finally:
        await opened.context.close()

    # A key in the query (?key=...) reached the server and its logs: it is not honoured.
    opened = await open_tab(browser, user, key=False)
    page = opened.page
    try:
        await page.goto(f"{user.base}/?key={user.key}")
        await expect(page.locator("#login-dialog")).to_be_visible()
        assert await page.evaluate("() => localStorage.getItem('canopy:api-key')") is None
    finally:
        await opened.context.close()


async def test_a_route_that_cannot_be_decoded_shows_the_start_page(tab: Tab, user: User) -> None:
    """A hand-made "#/s/%E0" threw in the router, and the page stayed blank (the tab fails on a page error)."""
    await tab.page.goto(f"{user.base}/#/s/%E0")
    await expect(tab.page.locator(".sidebar .new-session")).to_be_visible()
    await expect(tab.page.locator(".workspace-host")).not_to_be_empty()


async def test_sse_parser_and_cooperation_rows_in_the_page(tab: Tab, user: User) -> None:
    page = tab.page
    await page.goto(f"{user.base}/")
    await expect(page.locator(".sidebar .new-session")).to_be_visible()
    events = await page.evaluate("""async () => {
        const { SSEParser } = await import('/js/sse.js');
        const seen = [];
        const parser = new SSEParser((event) => seen.push(event));
        for (const chunk of ['retry: 500\\n\\nid: 1\\r', '\\ndata: {"a":', '1}\\r\\n\\r\\n: keep-alive\\n\\n',
                             'event: delta\\ndata: x\\n\\nid: 2\\ndata: two\\ndata: lines\\n', '\\n']) {
            parser.feed(chunk);
        }
        return { seen, retry: parser.retry };
    }""")
    assert events["retry"] == 500
    assert events["seen"] == [
        {"type": "message", "data": '{"a":1}', "id": "1"},
        {"type": "delta", "data": "x", "id": "1"},
        {"type": "message", "data": "two\nlines", "id": "2"},
    ]
    rows_ = await page.evaluate("""async () => {
        const { buildItems, describeRow, makeResolver, collectReceipts } = await import('/js/cooperation.js');
        const T = 't1';
        const created = (id, name, sid) => ({ role: 'tool', turn_id: T, tool_call_id: id,
            content: JSON.stringify({ session_id: sid, name, path: '/root/' + name, input_id: 'in-' + name,
                                      tree_id: 'tree' }) });
        const messages = [
            { id: 1, role: 'user', content: 'go', origin: { kind: 'human' }, turn_id: T },
            { id: 2, role: 'assistant', content: null, turn_id: T, tool_calls: [
                { id: 'c1', name: 'create_session', arguments: { name: 'a' } },
                { id: 'c2', name: 'create_session', arguments: { name: 'b' } }] },
            { id: 3, ...created('c1', 'a', 's-a') }, { id: 4, ...created('c2', 'b', 's-b') },
            { id: 5, role: 'assistant', content: null, turn_id: T, tool_calls: [
                { id: 'c3', type: 'function', function: { name: 'create_session', arguments: '{"name":"c"}' } },
                { id: 'c4', name: 'create_session', arguments: { name: 'a' } }] },
            { id: 6, ...created('c3', 'c', 's-c') },
            { id: 7, role: 'tool', turn_id: T, tool_call_id: 'c4', content: '{"error": "name taken"}' },
            { id: 8, role: 'assistant', content: 'thinking out loud', turn_id: T, tool_calls: [
                { id: 'c5', name: 'wait_inputs', arguments: { input_ids: ['in-a', 'in-b', 'in-c'] } }] },
        ];
        const items = buildItems(messages, { openTurnId: T });
        const resolve = makeResolver({ members: [], treeId: 'tree', receipts: collectReceipts(messages) });
        return items.map((item) => item.kind === 'tools'
            ? { kind: item.kind, calls: item.calls.length, ...describeRow(item, resolve) }
            : { kind: item.kind });
    }""")
    assert [r["kind"] for r in rows_] == ["user", "tools", "tools", "assistant", "tools"]
    created_row, failed_row, wait_row = rows_[1], rows_[2], rows_[4]
    assert created_row["calls"] == 3 and created_row["text"] == "created 3 sessions:"
    assert [t["label"] for t in created_row["targets"]] == ["a", "b", "c"]
    assert [t["sessionId"] for t in created_row["targets"]] == ["s-a", "s-b", "s-c"]
    assert failed_row["state"] == "failed" and failed_row["text"] == "could not create a"
    assert wait_row["state"] == "pending" and wait_row["text"] == "waiting for 3 tasks:"
    assert [t["sessionId"] for t in wait_row["targets"]] == ["s-a", "s-b", "s-c"]
