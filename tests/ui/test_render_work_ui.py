"""What a render costs and what the page keeps, read back in a real browser: a re-render parses no
tool result and signs no message content it already showed (they are read once, when fetched), and
the store keeps no tree that nothing observes, so visiting root after root does not grow the page's
memory for ever. Speed itself is measured by ``bench/ui_render.py``, never asserted here: it runs
the first test on a larger history (``RENDER_STEPS`` model steps with ``RENDER_OUTPUT_KB`` of output
each), which prints what a render's data work costs."""

from __future__ import annotations

import os
from typing import Any

import pytest

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from tests.ui.helpers import Tab, User, create_root, member_at, open_root, poll, tree, wait_result

expect = pytest.importorskip("playwright.async_api").expect

KEEP_WORKSPACES = 6  # frontend/js/main.js: the root pages kept (parked) besides the one shown
RENDER_STEPS = int(os.environ.get("CANOPY_BENCH_RENDER_STEPS", "200"))
RENDER_OUTPUT_KB = int(os.environ.get("CANOPY_BENCH_RENDER_OUTPUT_KB", "0"))


async def seed_tool_history(runtime: Runtime, session_id: str, calls: int, output_kb: int = 0) -> None:
    """``calls`` model steps in the history, each a text with a run_command call, then its JSON result
    (its stdout padded with ``output_kb`` KiB)."""
    async with runtime.db.tx() as conn:
        await conn.execute(
            "INSERT INTO thread_messages (session_id, role, content, tool_calls, tool_call_id) "
            "SELECT %s, CASE WHEN k = 0 THEN 'assistant' ELSE 'tool' END, "
            "CASE WHEN k = 0 THEN 'seeded text ' || n "
            "ELSE json_build_object('exit_code', 0, 'stdout', 'seeded output ' || n || repeat(E'\\n.', %s * 512), "
            "'stderr', '')::text END, "
            "CASE WHEN k = 0 THEN jsonb_build_array(jsonb_build_object('id', 'c' || n, 'name', 'run_command', "
            "'arguments', jsonb_build_object('command', 'echo ' || n))) END, "
            "CASE WHEN k = 1 THEN 'c' || n END "
            "FROM generate_series(1, %s) AS n, (VALUES (0), (1)) AS step (k) ORDER BY n, k",
            (session_id, output_kb, calls))


# Counts, from now on, the page's JSON.parse calls (all of them, and those of a seeded tool result)
# and its JSON.stringify calls whose output holds a seeded message's text (a signature built from it).
COUNT_JSON = """() => {
    const counts = window.__json = {parsed: 0, parsedSeeded: 0, signedSeeded: 0};
    const parse = JSON.parse;
    const stringify = JSON.stringify;
    JSON.parse = function (text, reviver) {
        counts.parsed += 1;
        if (typeof text === 'string' && text.includes('seeded output')) counts.parsedSeeded += 1;
        return parse.call(this, text, reviver);
    };
    JSON.stringify = function (...args) {
        const out = stringify.apply(this, args);
        if (typeof out === 'string' && out.includes('seeded text')) counts.signedSeeded += 1;
        return out;
    };
}"""


async def test_a_rerender_reads_no_message_it_already_showed(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    calls = RENDER_STEPS
    text = script(call(create("helper", script(say("helper ready")))),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("root ready"), task="set up a helper")
    created = await create_root(user, text, title="Many tool results")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])
    helper = member_at(await tree(user, root_id), "/root/helper")["session_id"]
    await seed_tool_history(runtime, root_id, calls, RENDER_OUTPUT_KB)
    await open_root(page, user.base, root_id)
    view = page.locator(f'.workspace[data-root-id="{root_id}"] .root-view')
    await expect(view.locator('.coop-row[data-tool="run_command"][data-state="done"]')).to_have_count(
        calls, timeout=300_000)
    await expect(view.locator(".msg.assistant")).to_have_count(calls + 1)

    async def stream_open() -> bool:
        return await page.evaluate(f"() => window.canopy.store.tree('{root_id}').connection === 'open'")

    await poll(stream_open, what="the tree's stream open")
    await page.evaluate(COUNT_JSON)
    await page.evaluate("""(id) => {
        const view = window.canopy.workspaces.get(id).rootView;
        const render = view.render.bind(view);
        window.__renders = 0;
        view.render = () => { window.__renders += 1; render(); };
    }""", root_id)
    # Something unrelated to the root's history happens: its helper works (events, the tree re-read,
    # and the root's view re-renders at each read).
    response = await user.http.post(f"/api/v1/sessions/{helper}/inputs",
                                    json={"text": script(say("helper news"), task="more for the helper")})
    assert response.status_code == 202, response.text
    await wait_result(user, response.json()["input_id"])

    async def rerendered() -> int:
        return await page.evaluate("() => window.__renders")

    await poll(rerendered, what="the root's view re-rendered")
    counts: dict[str, Any] = await page.evaluate("() => window.__json")
    # The old results are not parsed again, nor the old messages' text signed; what the page parses
    # (the stream's events) does not grow with the history shown.
    assert counts["parsedSeeded"] == 0, counts
    assert counts["signedSeeded"] == 0, counts
    assert counts["parsed"] < calls // 4, counts
    # Still all there, drawn from what was read once.
    await expect(view.locator('.coop-row[data-tool="run_command"][data-state="done"]')).to_have_count(calls)
    row = view.locator('details.coop-row[data-tool="run_command"]').first
    await row.locator("summary").click()
    await expect(row.locator(".coop-output")).to_contain_text("seeded output 1")
    print(await render_figure(page, root_id))


# A render's data work on the view's own history, as the page did it before (every tool result
# parsed, every message's content signed, each render) and as it does now (read once when fetched,
# signed by id), then the view's whole render() (data and DOM) as it is now; the median of each.
MEASURE_RENDER = """async (id) => {
    const { buildItems, collectReceipts, describeRow, makeResolver, withInterventions } =
        await import('/js/cooperation.js');
    const workspace = window.canopy.workspaces.get(id);
    const view = workspace.rootView;
    const { runtime } = view;
    const read = runtime.messages;
    const raw = read.map(({ parsed, calls, ...message }) => message);  // as fetched, never read
    const data = (messages, signMessage) => {
        const started = performance.now();
        const items = withInterventions(buildItems(messages, { openTurnId: runtime.detail?.current_turn_id ?? null }),
            runtime.interventions, id);
        const resolve = makeResolver({ members: workspace.tree.summary?.members ?? [], treeId: id,
            receipts: collectReceipts(messages) });
        let signed = 0;
        for (const item of items) {
            const signature = item.kind === 'tools' ? JSON.stringify([describeRow(item, resolve),
                item.calls.map((c) => [c.state, c.resultText?.length ?? 0])])
                : item.kind === 'intervention' ? item.key : signMessage(item);
            signed += signature.length;
        }
        return performance.now() - started;
    };
    const median = (values) => values.sort((a, b) => a - b)[Math.floor(values.length / 2)];
    const times = (fn) => median(Array.from({ length: 9 }, fn));
    const before = times(() => data(raw, (item) => JSON.stringify([item.message.id, item.message.content,
        item.message.origin])));
    const after = times(() => data(read, (item) => item.key));
    const render = times(() => {
        const started = performance.now();
        view.render();
        return performance.now() - started;
    });
    const bytes = read.reduce((sum, m) => sum + (m.content?.length ?? 0), 0);
    return { messages: read.length, bytes, before, after, render };
}"""


async def render_figure(page: Any, root_id: str) -> str:
    measured = await page.evaluate(MEASURE_RENDER, root_id)
    return (f"render {measured['messages']} messages / {measured['bytes'] / 2**20:.1f} MiB of content: data work "
            f"{measured['before']:.2f} ms per render before (parse each result, sign by content), "
            f"{measured['after']:.2f} ms now (read once, sign by id); the view's whole render() "
            f"{measured['render']:.2f} ms (median of 9)")


async def _open(page: Any, root_id: str) -> None:
    """Open a root from the session list, as a user does, and wait for its history."""
    await page.locator(f'.root-item[data-session-id="{root_id}"] .root-link').click()
    view = page.locator(f'.workspace[data-root-id="{root_id}"] .root-view')
    await expect(view.locator(".msg.assistant")).to_have_text(f"history of {root_id}")


async def test_the_store_keeps_only_the_trees_something_observes(tab: Tab, user: User, runtime: Runtime) -> None:
    page = tab.page
    roots: list[str] = []
    for index in range(KEEP_WORKSPACES + 3):
        created = await user.http.post("/api/v1/sessions", json={"title": f"Visited {index}"})
        root_id = created.json()["session"]["session_id"]
        async with runtime.db.tx() as conn:
            await conn.execute("INSERT INTO thread_messages (session_id, role, content) VALUES (%s, 'assistant', %s)",
                               (root_id, f"history of {root_id}"))
        roots.append(root_id)
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url) if "/messages" in request.url else None)
    await page.goto(f"{user.base}/")
    await expect(page.locator(".root-item")).to_have_count(len(roots))

    # Visit every root in turn; keep a weak reference to each one's runtimes (tree and root session).
    for root_id in roots:
        await _open(page, root_id)
        await page.evaluate("""(id) => {
            const workspace = window.canopy.workspaces.get(id);
            (window.__runtimes ??= []).push({id, tree: new WeakRef(workspace.tree),
                                             session: new WeakRef(workspace.rootView.runtime)});
        }""", root_id)
    shown = roots[-1]
    # The tree shown is observed: the store hands out the very runtime its views observe.
    assert await page.evaluate("(id) => window.canopy.store.tree(id) === window.canopy.workspaces.get(id).tree",
                               shown)

    # Nothing holds the trees whose pages were dropped (past the six kept): once collected, they are gone.
    cdp = await page.context.new_cdp_session(page)
    dropped = roots[:-KEEP_WORKSPACES]

    async def alive() -> list[str]:
        await cdp.send("HeapProfiler.collectGarbage")
        return await page.evaluate("""() => window.__runtimes
            .filter((r) => r.tree.deref() !== undefined || r.session.deref() !== undefined).map((r) => r.id)""")

    async def only_kept() -> list[str] | None:
        living = await alive()
        return living if not set(living) & set(dropped) else None

    living = await poll(only_kept, timeout=30, every=0.5, what="the dropped pages' runtimes collected")
    assert set(living) == set(roots[-KEEP_WORKSPACES:]), living

    # A parked page shown again observes its own runtime again (the store hands it out) and reads only
    # what is new; a dropped one starts afresh and reads its history whole.
    parked = roots[-KEEP_WORKSPACES]
    reads.clear()
    await _open(page, parked)
    assert await page.evaluate("(id) => window.canopy.store.tree(id) === window.canopy.workspaces.get(id).tree",
                               parked)

    async def read_again(session_id: str) -> list[str]:
        return [url for url in reads if f"/sessions/{session_id}/messages" in url]

    parked_reads = await poll(lambda: read_again(parked), what="the parked page's messages read again")
    assert all("after=" in url for url in parked_reads), parked_reads
    reads.clear()
    await _open(page, dropped[0])
    dropped_reads = await poll(lambda: read_again(dropped[0]), what="the dropped page's messages read")
    assert "after=" not in dropped_reads[0], dropped_reads
