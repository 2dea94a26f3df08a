"""The timeline tab in a real browser: a real 6-child fan-out drawn live and then finished (its
drawn Run bars, queued and wait bars checked against the API), hover and click, a 500-member
tree drawn lane by lane as it scrolls, its frame times measured, the phone polish (where the
session list is, a floating state panel), and screenshots at three widths in both themes.

The 500-member tree has ``TIMELINE_TURNS`` Turns per member: 2 in the suite (4,500 intervals;
seeding through the repositories is most of the test's time), 16 for the README's figure
(10,000 Runs, 30,000 intervals), which ``bench/timeline.py`` runs this test to print."""

from __future__ import annotations

import os
import statistics
from typing import Any

import pytest

from actors.runtime import Runtime
from tests.api.test_api_timeline import CHILD_DELAY_MS, fan_out, peak
from tests.persistence.helpers import seed_worked_tree
from tests.ui.helpers import (
    Tab,
    User,
    create_root,
    get,
    horizontal_overflow,
    open_root,
    poll,
    shoot,
    wait_result,
)

expect = pytest.importorskip("playwright.async_api").expect

WIDTHS = (375, 1280, 2200)
TIMELINE_TURNS = int(os.environ.get("CANOPY_BENCH_TIMELINE_TURNS", "2"))


async def model(page: Any, tree_id: str) -> dict[str, Any]:
    """What the timeline view drew last (its own account: bars with times and pixels)."""
    return await page.evaluate("(id) => window.canopy.timelines.get(id)?.model() ?? null", tree_id)


async def open_timeline(page: Any, base: str, root_id: str) -> Any:
    await open_root(page, base, root_id)
    await page.locator(".workspace:not([hidden]) .state-panel .timeline-btn").click()
    view = page.locator(f'.timeline-view[data-tree-id="{root_id}"]')
    await expect(view).to_be_visible()
    await expect(page.locator(".tab.active")).to_contain_text("Timeline")
    return view


async def _drawn(page: Any, tree_id: str) -> bool:
    drawn = await model(page, tree_id)
    return bool(drawn and drawn["loaded"])


async def test_fan_out_timeline_live_then_finished(tab: Tab, user: User) -> None:
    page = tab.page
    # The root asks before it fans out, so the whole run happens with the timeline open: a loaded
    # machine can take longer to open the page than the tree takes to run.
    created = await create_root(user, fan_out(ask_first="Start?"), title="Fan out, timed")
    root_id = created["session"]["session_id"]
    await open_timeline(page, user.base, root_id)
    request = (await poll(lambda: get(user, f"/trees/{root_id}/requests"), what="the root's question"))[0]
    await poll(lambda: _drawn(page, root_id), what="the timeline drawn")
    answered = await user.http.post(f"/api/v1/requests/{request['id']}/answer", json={"answer": "go"})
    assert answered.status_code == 200, answered.text

    # Live: bars appear while the tree runs (open ones grow), without reloading anything.
    seen: list[int] = []

    async def grew() -> bool:
        drawn = await model(page, root_id)
        if drawn and drawn["loaded"]:
            seen.append(len([b for b in drawn["bars"] if b["kind"] == "run"]))
        return len(set(seen)) >= 3 and seen[-1] > seen[0]

    await poll(grew, timeout=60, every=0.2, what="run bars added live")

    await wait_result(user, created["input"]["input_id"], timeout=90)
    api_runs = [i for i in (await get(user, f"/trees/{root_id}/timeline"))["intervals"] if i["kind"] == "run"]

    async def settled() -> dict[str, Any] | None:
        drawn = await model(page, root_id)
        runs = [b for b in drawn["bars"] if b["kind"] == "run"]
        return drawn if drawn["open"] == 0 and len(runs) == len(api_runs) else None

    await page.locator(".timeline-toolbar button", has_text="Fit").click()
    drawn = await poll(settled, timeout=30, what="the finished tree drawn whole")
    canvas = page.locator(".timeline-canvas")
    await expect(canvas).to_have_attribute("data-live", "false")
    await expect(canvas).to_have_attribute("data-lanes", "7")
    lanes = {lane["sessionId"]: lane["path"] for lane in drawn["lanes"]}
    assert list(lanes.values()) == ["/root"] + [f"/root/w{i}" for i in range(6)]

    runs = [b for b in drawn["bars"] if b["kind"] == "run"]
    assert sorted(b["id"] for b in runs) == sorted(r["id"] for r in api_runs)  # cross-check with the API
    assert peak(runs) == 4  # the slot limit, reached

    # Two children queued until a sibling finished: 3 slots were free at their creation, the root's
    # park freed a fourth, and the last two waited for the first child to end.
    children = [b for b in runs if lanes[b["sessionId"]] != "/root"]
    queued = [b for b in drawn["bars"] if b["kind"] == "queued" and lanes[b["sessionId"]] != "/root"]
    waited = [b for b in queued if b["end"] >= min(c["end"] for c in children)]
    assert len(queued) == 6 and len(waited) == 2, queued
    assert all(b["end"] - b["start"] >= CHILD_DELAY_MS for b in waited)

    (wait,) = [b for b in drawn["bars"] if b["kind"] == "wait" and b.get("waitsOn")]  # not the question's
    assert lanes[wait["sessionId"]] == "/root" and sorted(wait["waitsOn"]) == sorted(list(lanes)[1:])
    assert wait["start"] < min(b["end"] for b in children) and wait["end"] >= max(b["end"] for b in children)
    # On screen, the wait bar spans the children's bars horizontally.
    assert wait["x"] <= min(b["x"] + b["w"] for b in children) and wait["x"] + wait["w"] >= max(
        b["x"] + b["w"] for b in children) - 1

    # Hover: a card with the wait's ids and duration.
    box = await canvas.bounding_box()
    assert box is not None
    await page.mouse.move(box["x"] + wait["x"] + wait["w"] / 2, box["y"] + wait["y"] + wait["h"] / 2)
    card = page.locator(".timeline-card")
    await expect(card).to_be_visible()
    await expect(card).to_contain_text("Waiting")
    await expect(card).to_contain_text(wait["id"])
    await shoot(page, "timeline-hover", widths=(1280,))

    # The text alternative: one row per lane, with the same Run counts.
    await page.locator(".timeline-text summary").click()
    table_rows = page.locator(".timeline-table tbody tr")
    await expect(table_rows).to_have_count(7)
    await expect(table_rows.nth(0).locator("th")).to_have_text("/root")
    root_runs = sum(1 for run in api_runs if run["session_id"] == root_id)  # 2, or more after a recovery
    await expect(table_rows.nth(0).locator("td").nth(0)).to_have_text(str(root_runs))
    await page.locator(".timeline-text summary").click()

    # Click a child's Run bar: its tab opens at that Run's messages.
    target = next(b for b in children if lanes[b["sessionId"]] == "/root/w3")
    await page.mouse.click(box["x"] + target["x"] + max(target["w"] / 2, 1), box["y"] + target["y"] + target["h"] / 2)
    member = page.locator(f'.side-pane .member-view[data-session-id="{target["sessionId"]}"]')
    await expect(member).to_be_visible()
    await expect(member.locator(".view-path")).to_have_text("/root/w3")
    await expect(member.locator(".msg.revealed")).to_have_count(1)

    # Screenshots: three widths, both themes (the canvas redraws with the theme's colours).
    await page.locator(".tab", has_text="Timeline").locator(".tab-select").click()
    for theme in ("light", "dark"):
        await page.evaluate("(theme) => { document.documentElement.dataset.theme = theme; }", theme)
        await shoot(page, f"timeline-{theme}", widths=WIDTHS)
        await page.set_viewport_size({"width": 375, "height": 800})
        await page.wait_for_timeout(300)
        assert await horizontal_overflow(page) == []
        assert len((await model(page, root_id))["lanes"]) == 7
        await page.set_viewport_size({"width": 1280, "height": 800})


async def test_phone_polish_empty_state_and_floating_panel(tab: Tab, user: User) -> None:
    page = tab.page
    await page.set_viewport_size({"width": 375, "height": 760})
    await page.goto(f"{user.base}/#/")
    empty = page.locator(".empty-body p").first
    await expect(empty.locator(".narrow-only")).to_be_visible()
    await expect(empty.locator(".wide-only")).to_be_hidden()
    await expect(empty).to_contain_text("behind the ☰ menu button")
    await page.locator(".empty-page .menu-btn").click()
    await expect(page.locator(".sidebar")).to_be_visible()
    await page.keyboard.press("Escape")
    await shoot(page, "empty-phone", widths=(375,))

    created = await create_root(user, "hello", title="Floating panel")
    root_id = created["session"]["session_id"]
    await wait_result(user, created["input"]["input_id"])
    await open_root(page, user.base, root_id)
    toggle = page.locator(".workspace:not([hidden]) .state-slot .dock-toggle")
    await expect(toggle).to_have_attribute("aria-pressed", "false")
    slot = page.locator(".workspace:not([hidden]) .state-slot")
    assert await slot.evaluate("(el) => getComputedStyle(el).position") == "static"
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-pressed", "true")
    assert await slot.evaluate("(el) => getComputedStyle(el).position") == "absolute"
    assert await page.evaluate("() => localStorage.getItem('canopy:state-panel')") == "float"
    await shoot(page, "state-panel-floating", widths=(375, 1280))

    await page.reload()  # remembered
    await page.wait_for_selector(f'.workspace[data-root-id="{root_id}"] .root-view')
    await expect(toggle).to_have_attribute("aria-pressed", "true")
    assert await slot.evaluate("(el) => getComputedStyle(el).position") == "absolute"
    assert await horizontal_overflow(page) == []
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-pressed", "false")
    assert await page.evaluate("() => localStorage.getItem('canopy:state-panel')") == "dock"


# A scripted pan and zoom: each step is one frame's worth of navigation.
PAN_ZOOM = """async (id) => {
    const view = window.canopy.timelines.get(id);
    const frames = [];
    const drawsBefore = view.stats.draws;
    let last = performance.now();
    const steps = [];
    for (let i = 0; i < 40; i += 1) steps.push(() => view.zoom(0.9));
    for (let i = 0; i < 60; i += 1) steps.push(() => view.pan(0.03));
    for (let i = 0; i < 60; i += 1) steps.push(() => view.scrollLanes(120));
    for (let i = 0; i < 40; i += 1) steps.push(() => view.zoom(1.15));
    steps.push(() => view.fit(true));
    for (let i = 0; i < 30; i += 1) steps.push(() => view.scrollLanes(-200));
    for (const step of steps) {
        step();
        await new Promise((resolve) => requestAnimationFrame(resolve));
        const now = performance.now();
        frames.push(now - last);
        last = now;
    }
    await new Promise((resolve) => requestAnimationFrame(resolve));
    return { frames, draws: view.stats.draws - drawsBefore, drawMs: view.stats.drawMs.slice(-steps.length) };
}"""


def _pct(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def seeded_timeline_figure(page: Any, base: str, root_id: str, expected: int) -> str:
    """Open the seeded tree's timeline, wait until all ``expected`` intervals are loaded, run the
    scripted pan and zoom, and describe the draw times and frame intervals it measured."""
    await page.set_viewport_size({"width": 1600, "height": 900})
    await open_timeline(page, base, root_id)

    async def loaded() -> dict[str, Any] | None:
        drawn = await model(page, root_id)
        return drawn if drawn and drawn["items"] == expected else None

    await poll(loaded, timeout=180, what="the seeded timeline loaded")
    measured = await page.evaluate(PAN_ZOOM, root_id)
    frames, draws = measured["frames"], measured["drawMs"]
    lanes = len((await model(page, root_id))["lanes"])
    return (f"timeline {lanes} lanes / {expected} intervals: draw p50 {statistics.median(draws):.2f} ms, "
            f"p95 {_pct(draws, 0.95):.2f} ms, max {max(draws):.2f} ms; frame interval p50 "
            f"{statistics.median(frames):.1f} ms, p95 {_pct(frames, 0.95):.1f} ms over {len(frames)} "
            f"pan/zoom frames ({measured['draws']} draws)")


async def test_500_members_render_only_what_is_on_screen(tab: Tab, user: User, runtime: Runtime) -> None:
    turns, wait_every = TIMELINE_TURNS, 2 if TIMELINE_TURNS < 4 else 4
    tree = await seed_worked_tree(runtime.db, user.scope, members=500, turns_per_member=turns, wait_every=wait_every)
    root_id = str(tree.tree_id)
    page = tab.page
    # Per member: a Run per Turn and one more per wait, as many queued intervals, the waits, a tool call per Turn.
    waits = turns // wait_every
    runs = turns + waits
    figure = await seeded_timeline_figure(page, user.base, root_id, expected=500 * (2 * runs + waits + turns))
    print(figure)
    after = await model(page, root_id)
    assert [lane["path"] for lane in after["lanes"]] == [m["path"] for m in (
        await get(user, f"/trees/{root_id}/timeline?limit=1"))["members"]]
    assert len(after["lanes"]) == 500
    await expect(page.locator(".timeline-canvas")).to_have_attribute("data-lanes", "500")
    lanes_drawn = {b["lane"] for b in after["bars"] if b["lane"] >= 0}
    # Only what is on screen: the lanes drawn are the ~30 that fit in 900 px, not all 500.
    assert 10 <= len(lanes_drawn) <= 40, sorted(lanes_drawn)
    await shoot(page, "timeline-500", widths=(1600,))
