"""The UI against the app deployed on Ray Serve the way ``canopy up`` deploys it (api/up.py's
``start_serve``), not under plain uvicorn: signed in by the printed link's ``#key=``, a new root
started from the page runs to completion."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
import pytest

from actors.runtime import Runtime
from actors.scripted import say, script
from persistence.records import Scope
from tests.api.helpers import served
from tests.ui.conftest import ADMIN_TOKEN
from tests.ui.helpers import User, get, open_tab, rows, shoot, sign_in_by_link

if TYPE_CHECKING:
    from playwright.async_api import Browser

expect = pytest.importorskip("playwright.async_api").expect

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
async def serve_base(runtime: Runtime) -> AsyncIterator[str]:
    async with served(runtime, ADMIN_TOKEN) as url:
        yield url


async def test_ui_on_ray_serve_runs_a_root_to_completion(browser: Browser, runtime: Runtime, scope: Scope,
                                                         serve_base: str) -> None:
    key = await runtime.create_api_key(scope)
    async with httpx.AsyncClient(base_url=serve_base, headers={"Authorization": f"Bearer {key}"},
                                 timeout=30) as http:
        user = User(scope, key, http, serve_base)
        opened = await open_tab(browser, user, key=False)
        page = opened.page
        try:
            await sign_in_by_link(page, serve_base, key)

            await page.locator(".sidebar .new-session").click()
            await page.locator(".new-page .composer-input").fill(
                script(say("served by Ray Serve", delay_ms=500), task="A short task on Serve"))
            await page.locator(".new-page .composer button[type=submit]").click()
            await page.wait_for_url(re.compile(rf"#/s/{UUID}$"))
            root_id = page.url.rsplit("/", 1)[-1]
            root = page.locator(f'.workspace[data-root-id="{root_id}"] .root-view')
            await expect(root.locator(".msg.user .msg-text")).to_contain_text("A short task on Serve")
            await expect(root.locator(".msg.assistant")).to_have_text("served by Ray Serve", timeout=60_000)
            item = page.locator(f'.root-item[data-session-id="{root_id}"]')
            await expect(item).to_have_attribute("data-activity", "idle", timeout=30_000)
            await expect(root.locator(".turn-status")).to_be_hidden()
            await shoot(page, "serve")
        finally:
            await opened.context.close()
        assert not opened.errors, opened.errors

        session = await get(user, f"/sessions/{root_id}")
        result = await get(user, f"/turns/{session['turn_id']}/result")
        assert (result["status"], result["output"]) == ("completed", "served by Ray Serve")
        stored = await rows(runtime.db, "SELECT status FROM turns WHERE session_id = %s", root_id)
        assert [r["status"] for r in stored] == ["completed"]
