"""The timeline view's frame budget: a 500-member tree with 10,000 Runs (written through the
repositories), drawn in Debian's Chromium, then a scripted pan and zoom; prints the draw times
and the frame intervals measured in the page (requestAnimationFrame).

    PYTHONPATH=. python bench/timeline_render.py [--members 500] [--turns 16]

Starts its own database (CANOPY_DATABASE_URL's server, else an embedded one), a Canopy runtime
(local Ray) and the app under uvicorn on a free loopback port; stops them all at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.runtime import Runtime
from api.app import create_app
from bench.db_ops import bench_database
from persistence.records import Scope
from persistence.settings import Settings
from tests.api.helpers import free_port
from tests.persistence.helpers import seed_worked_tree
from tests.ui.helpers import CHROMIUM, CHROMIUM_ARGS, User, open_tab
from tests.ui.test_timeline_ui import seeded_timeline_figure


async def api_reads(http: httpx.AsyncClient, tree_id: str) -> str:
    """How long the whole timeline takes to read (pages of 5,000) and the trace to export."""
    started = time.perf_counter()
    pages, since, items = 0, None, 0
    while True:
        page = (await http.get(f"/trees/{tree_id}/timeline", params={"limit": 5000, "since": since})).json()
        pages, items, since = pages + 1, items + len(page["intervals"]), page["next_cursor"]
        if since is None:
            break
    read = time.perf_counter() - started
    started = time.perf_counter()
    trace = (await http.get(f"/trees/{tree_id}/trace")).json()
    exported = time.perf_counter() - started
    return (f"timeline API: {items} intervals in {pages} pages, {read * 1000:.0f} ms; trace: "
            f"{len(trace['traceEvents'])} events, {exported * 1000:.0f} ms")


async def main(members: int, turns: int) -> None:
    from playwright.async_api import async_playwright

    async with bench_database() as url:
        with tempfile.TemporaryDirectory(prefix="canopy-bench-") as data_dir:
            runtime = await Runtime.start(Settings(database_url=url, data_dir=Path(data_dir)))
            try:
                scope = Scope("bench", "timeline")
                tree = await seed_worked_tree(runtime.db, scope, members=members, turns_per_member=turns,
                                              wait_every=4)
                runs = turns + turns // 4
                expected = members * (2 * runs + turns // 4 + turns)
                key = await runtime.create_api_key(scope)
                port = free_port()
                server = uvicorn.Server(uvicorn.Config(create_app(runtime), host="127.0.0.1", port=port,
                                                       log_level="warning"))
                serving = asyncio.create_task(server.serve())
                while not server.started:
                    if serving.done():
                        serving.result()  # it failed to start: raise its error
                    await asyncio.sleep(0.05)
                base = f"http://127.0.0.1:{port}"
                try:
                    async with async_playwright() as playwright, httpx.AsyncClient(
                            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
                        print(await api_reads(http, str(tree.tree_id)))
                        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                                   args=CHROMIUM_ARGS)
                        tab = await open_tab(browser, User(scope, key, http, base))
                        print(await seeded_timeline_figure(tab.page, base, str(tree.tree_id), expected))
                        await browser.close()
                finally:
                    server.should_exit = True
                    await serving
            finally:
                await runtime.close(shutdown_ray=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=500)
    parser.add_argument("--turns", type=int, default=16, help="Turns per member (every 4th parks and resumes)")
    args = parser.parse_args()
    asyncio.run(main(args.members, args.turns))
