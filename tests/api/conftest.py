"""The HTTP API under uvicorn in the test's event loop, on the session's real Ray runtime.

(The Ray Serve deployment has its own fixture in test_api_serve.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from actors.runtime import Runtime
from api.app import create_app
from api.sse import StreamSettings
from persistence.records import Scope
from tests.api.helpers import ADMIN_TOKEN, METRICS_TOKEN, client
from tests.ports import free_port

# Fast heartbeats and polls, so the tests see them within a second or two.
TEST_STREAMS = StreamSettings(heartbeat_seconds=1.0, poll_seconds=2.0, fallback_poll_seconds=0.2, retry_ms=500)


@dataclasses.dataclass
class ApiServer:
    url: str
    app: FastAPI


# As Serve's proxy keeps them (its default, 90 s). uvicorn's own 5 s is httpx's idle expiry too: a
# client then reused a connection the server was closing, and the request failed (httpx.ReadError).
KEEP_ALIVE_SECONDS = 90


@contextlib.asynccontextmanager
async def uvicorn_server(app: FastAPI) -> AsyncIterator[ApiServer]:
    """The app under uvicorn on a free loopback port, in the test's event loop."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", timeout_graceful_shutdown=2,
                                           timeout_keep_alive=KEEP_ALIVE_SECONDS))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    yield ApiServer(f"http://127.0.0.1:{port}", app)
    server.should_exit = True
    await task


@pytest.fixture(scope="session")
async def api(runtime: Runtime) -> AsyncIterator[ApiServer]:
    async with uvicorn_server(create_app(runtime, admin_token=ADMIN_TOKEN, stream_settings=TEST_STREAMS)) as server:
        yield server


@pytest.fixture(scope="session")
async def second_api(runtime: Runtime) -> AsyncIterator[ApiServer]:
    """Another API replica on the same database: its own key cache, event listener and streams;
    it also accepts a metrics token."""
    app = create_app(runtime, admin_token=ADMIN_TOKEN, metrics_token=METRICS_TOKEN, stream_settings=TEST_STREAMS)
    async with uvicorn_server(app) as server:
        yield server


ClientFactory = Callable[[Scope], Awaitable[httpx.AsyncClient]]


# The test pytest runs next in this process, kept by the hook below for ``settle``.
_NEXT = pytest.StashKey["pytest.Item | None"]()


@pytest.hookimpl(tryfirst=True)  # before the default hook tears the fixtures down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    item.stash[_NEXT] = nextitem


@pytest.fixture(autouse=True)
async def settle(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After the last test of a module that uses the runtime, wait until no Run executes or queues,
    so the API tests leave no work behind to write into the shared database while later suites
    count its rows. It asks for the runtime only where the test does: the modules that start
    deployments of their own (doctor, canopy up, packaging) stay out of the runtime's xdist group
    and run beside it."""
    runtime: Runtime | None = request.getfixturevalue("runtime") if "runtime" in request.fixturenames else None
    yield
    following = request.node.stash.get(_NEXT, None)
    if runtime is None or (following is not None and following.module is request.node.module):
        return
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        async with runtime.db.tx() as conn:
            cur = await conn.execute("SELECT count(*) AS n FROM runs WHERE status IN ('pending', 'running')")
            busy = await cur.fetchone()
        if busy is not None and busy["n"] == 0:
            return
        await asyncio.sleep(0.2)


@pytest.fixture
async def client_for(api: ApiServer, runtime: Runtime) -> AsyncIterator[ClientFactory]:
    """A factory: an HTTP client authenticated with a fresh API key of the given scope."""
    opened: list[httpx.AsyncClient] = []

    async def make(scope: Scope) -> httpx.AsyncClient:
        http = client(api.url, await runtime.create_api_key(scope))
        opened.append(http)
        return http

    yield make
    for http in opened:
        await http.aclose()


@pytest.fixture
async def http(client_for: ClientFactory, scope: Scope) -> httpx.AsyncClient:
    """A client of the test's own fresh scope."""
    return await client_for(scope)
