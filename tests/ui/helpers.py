"""Helpers for the browser tests: screenshots, polling, durable reads, layout checks, seeding."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from actors.runtime import Runtime
from persistence import sessions
from persistence.records import Scope
from tests.actors.helpers import rows  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page

CHROMIUM = os.environ.get("CANOPY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"


@dataclasses.dataclass
class User:
    """One test's user: an API key of a fresh scope and an HTTP client with it."""

    scope: Scope
    key: str
    http: httpx.AsyncClient
    base: str


@dataclasses.dataclass
class Tab:
    """A browser page of the app with what it logged."""

    page: Page
    context: BrowserContext
    errors: list[str]


async def open_tab(browser: Browser, user: User, *, width: int = 1280, height: int = 800, key: bool = True,
                   theme: str | None = None) -> Tab:
    context = await browser.new_context(viewport={"width": width, "height": height})
    init = ""
    if key:
        init += f"localStorage.setItem('canopy:api-key', {json.dumps(user.key)});"
    if theme:
        init += f"localStorage.setItem('canopy:theme', {json.dumps(theme)});"
    if init:
        await context.add_init_script(init)
    page = await context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    page.on("console", lambda message: errors.append(f"console.error: {message.text}")
            if message.type == "error" and "Failed to load resource" not in message.text else None)
    return Tab(page, context, errors)


async def sign_in_by_link(page: Page, base: str, key: str) -> None:
    """Open the link ``canopy up`` prints (the key in the ``#key=`` fragment) and agree to use its
    key: the page signs in, keeps the key in localStorage and scrubs it from the address bar."""
    from playwright.async_api import expect  # optional: the suite is skipped without it

    await page.goto(f"{base}/#key={key}")
    await page.locator("#link-key-accept").click()
    await expect(page.locator("#link-key-dialog")).to_be_hidden()
    await expect(page.locator(".sidebar .new-session")).to_be_visible()
    await expect(page.locator("#login-dialog")).to_be_hidden()
    assert key not in page.url
    assert await page.evaluate("() => localStorage.getItem('canopy:api-key')") == key


async def shoot(page: Page, name: str, widths: tuple[int, ...] = (1280, 375), height: int | None = None) -> None:
    """Screenshots of the page as it is, at each width, into test-artifacts/ui/; restores the size."""
    original = page.viewport_size or {"width": 1280, "height": 800}
    for width in widths:
        await page.set_viewport_size({"width": width, "height": height or original["height"]})
        await page.wait_for_timeout(250)
        await page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"))
    await page.set_viewport_size(original)
    await page.wait_for_timeout(150)


async def poll(check: Callable[[], Awaitable[Any]], timeout: float = 60.0, every: float = 0.2,
               what: str = "condition") -> Any:
    """Await ``check()`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s (last: {value!r})")
        await asyncio.sleep(every)


async def get(user: User, path: str) -> Any:
    response = await user.http.get(f"/api/v1{path}")
    assert response.status_code == 200, response.text
    return response.json()


async def create_root(user: User, text: str, title: str = "") -> dict[str, Any]:
    response = await user.http.post("/api/v1/sessions", json={"input": text, **({"title": title} if title else {})})
    assert response.status_code == 201, response.text
    return response.json()


async def tree(user: User, tree_id: str) -> dict[str, Any]:
    return await get(user, f"/trees/{tree_id}")


def member_at(summary: dict[str, Any], path: str) -> dict[str, Any]:
    return next(m for m in summary["members"] if m["path"] == path)


async def wait_result(user: User, input_id: str, timeout: float = 60.0) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        result = await get(user, f"/inputs/{input_id}/result")
        return result if result["terminal"] else None

    return await poll(done, timeout, what=f"input {input_id} terminal")


async def open_root(page: Page, base: str, root_id: str) -> None:
    await page.goto(f"{base}/#/s/{root_id}")
    await page.wait_for_selector(f'.workspace[data-root-id="{root_id}"] .root-view')


# The main regions whose content must never be wider than they are.
REGIONS = [
    "html", "body", ".app", ".sidebar", ".root-nav", ".workspace-host", ".workspace", ".main-pane",
    ".side-pane", ".state-panel", ".view-scroll", ".messages", ".view-bottom", ".coop-list-scroll",
    ".session-view", ".tab-panels",
]


async def horizontal_overflow(page: Page) -> list[str]:
    """The visible regions (and the page) whose scrollWidth exceeds clientWidth."""
    return await page.evaluate(
        """(selectors) => {
            const bad = [];
            for (const selector of selectors) {
                for (const el of document.querySelectorAll(selector)) {
                    if (!el.getClientRects().length) continue;  // not displayed
                    if (el.scrollWidth > el.clientWidth + 1) {
                        bad.push(`${selector}: scrollWidth ${el.scrollWidth} > clientWidth ${el.clientWidth}`);
                    }
                }
            }
            if (document.documentElement.scrollWidth > window.innerWidth) {
                bad.push(`document: ${document.documentElement.scrollWidth} > ${window.innerWidth}`);
            }
            return bad;
        }""",
        REGIONS,
    )


async def seed_tree(runtime: Runtime, scope: Scope, *, children: int, grandchildren: int,
                    long_titles: bool = True) -> tuple[str, list[str]]:
    """A tree made directly through the repositories: root + children + grandchildren (no turns)."""
    from persistence import projects

    config = {"agent_id": None, "name": "assistant", "model": "canopy/scripted", "instructions": "", "tools": [],
              "approval_mode": "auto"}
    made: list[str] = []
    async with runtime.db.tx() as conn:
        project = await projects.default_project(conn, scope, runtime.projects_root)
        root_id = await sessions.create_root(conn, scope, project_id=project["project_id"], agent_id=None,
                                             agent_config=config, slot_limit=4, title="A very large cooperation tree "
                                             "whose title is long enough to need an ellipsis in every list")
        made.append(str(root_id))
        root = await sessions.get_session_row(conn, scope, root_id)
        run = uuid.uuid4()
        remaining = grandchildren
        for i in range(children):
            title = (f"Child {i:02d}: investigate a deliberately long and winding task description that never "
                     "seems to end so the title must be cut" if long_titles else f"child {i}")
            child = await sessions.create_child(conn, root, name=f"child-{i:02d}", agent_id=None, agent_config=config,
                                                max_depth=2, max_members=10_000, created_by_run_id=run, title=title)
            made.append(str(child["session_id"]))
            parent = await sessions.get_session_row(conn, scope, child["session_id"])
            share = -(-remaining // (children - i))  # spread the grandchildren evenly
            for j in range(share):
                grandchild = await sessions.create_child(
                    conn, parent, name=f"worker-{j:02d}", agent_id=None, agent_config=config, max_depth=2,
                    max_members=10_000,
                    created_by_run_id=run, title=f"Worker {i:02d}.{j:02d} with a title long enough to be cut off")
                made.append(str(grandchild["session_id"]))
            remaining -= share
    return str(root_id), made
