"""Browser tests: the real app (API + UI) under uvicorn on the session's Ray runtime, driven by
Debian's Chromium through Playwright's async API (the same event loop as the server, so the
server keeps serving while a test awaits the browser).

Chromium comes from the ``chromium`` apt package (``.ci/browser-up.sh``), never from
``playwright install``. Without it the suite is skipped, unless ``CANOPY_REQUIRE_BROWSER=1``
turns the skip into a failure (CI).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from actors.runtime import Runtime
from persistence.records import Scope
from tests.api.conftest import KEEP_ALIVE_SECONDS
from tests.ui.helpers import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, Tab, User, open_tab

ADMIN_TOKEN = "ui-test-admin-token"

try:
    from playwright.async_api import Browser, async_playwright, expect

    # Generous waits: a loaded 2-core CI machine must slow these tests down, never fail them.
    expect.set_options(timeout=15_000)
except ImportError:  # pragma: no cover - the test extra installs it
    async_playwright = None


def _missing() -> str | None:
    if async_playwright is None:
        return "playwright is not installed (pip install -e '.[test]')"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (run .ci/browser-up.sh)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing()
    if reason is None:
        return
    if os.environ.get("CANOPY_REQUIRE_BROWSER") == "1":
        raise pytest.UsageError(f"browser tests required but {reason}")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@dataclasses.dataclass
class UiServer:
    url: str


@pytest.fixture(scope="session")
async def ui_server(runtime: Runtime) -> AsyncIterator[UiServer]:
    from api.app import create_app
    from api.sse import StreamSettings
    from tests.ports import free_port

    # Quick heartbeats and polls: a test never waits on a slow timer.
    streams = StreamSettings(heartbeat_seconds=2.0, poll_seconds=2.0, fallback_poll_seconds=0.3, retry_ms=500)
    app = create_app(runtime, admin_token=ADMIN_TOKEN, stream_settings=streams)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1, timeout_keep_alive=KEEP_ALIVE_SECONDS))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    yield UiServer(f"http://127.0.0.1:{port}")
    server.should_exit = True
    # Open SSE streams end with the browser; do not wait long for stragglers.
    try:
        await asyncio.wait_for(task, 10)
    except TimeoutError:
        server.force_exit = True


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        await chromium.close()


@pytest.fixture
async def user(runtime: Runtime, ui_server: UiServer, scope: Scope) -> AsyncIterator[User]:
    key = await runtime.create_api_key(scope)
    async with httpx.AsyncClient(base_url=ui_server.url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=30) as http:
        yield User(scope, key, http, ui_server.url)


@pytest.fixture
async def tab(browser: Browser, user: User) -> AsyncIterator[Tab]:
    """The app at 1280x800 with the user's key already stored."""
    opened = await open_tab(browser, user)
    yield opened
    await opened.context.close()
    assert not opened.errors, opened.errors


@pytest.fixture(scope="session", autouse=True)
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
