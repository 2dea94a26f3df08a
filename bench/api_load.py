"""HTTP load: N concurrent clients create roots and submit inputs for a while; print the figures.

    python bench/api_load.py [--duration 60] [--clients 50] [--input-sessions 8]
    python bench/api_load.py --url http://127.0.0.1:8000 --api-key cnp_…   (an already running API)

Without --url it starts its own ``canopy up`` (fresh data dir, free ports) and stops it at the end.
Each client loops: ``POST /sessions`` (a new root, no input) then ``POST /sessions/{id}/inputs``
(a one-step scripted task) to one of a few shared worker sessions, so the actors keep working
through FIFO queues while the API is measured; a root with an input per request would instead
measure how fast Ray can start one worker process per new session. Prints requests/s, p50/p99
latency per route and overall, and the error count (any non-2xx answer or transport error).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
TASK = "bench task\n#!script\n" + json.dumps([{"say": "ok"}])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CanopyUp:
    """A ``canopy up`` subprocess on a fresh data dir; its printed API key."""

    def __init__(self, replicas: int = 1) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="cnp-bench-"))
        self.port = _free_port()
        self.lines: list[str] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANOPY_") and k != "RAY_ADDRESS"}
        env.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "PYTHONUNBUFFERED": "1"})
        self.log = (self.data_dir / "canopy-up.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "up", "--port", str(self.port), "--dashboard-port",
             str(_free_port()), "--data-dir", str(self.data_dir / "data"), "--replicas", str(replicas)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_ready(self, timeout: float = 300.0) -> tuple[str, str, str]:
        """The base URL, the printed API key and the printed (generated) admin token."""
        deadline = time.monotonic() + timeout
        while not any("Press Ctrl-C" in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("canopy up did not start; see " + self.log.name)
            time.sleep(0.2)
        key = re.search(r"API key\s+(cnp_\S+)", "\n".join(self.lines))
        admin = re.search(r"Admin\s+(adm_\S+)", "\n".join(self.lines))
        assert key and admin, self.lines
        return f"http://127.0.0.1:{self.port}", key.group(1), admin.group(1)

    def stop(self, keep_log: bool) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()
        if keep_log:
            print(f"canopy up's log: {self.log.name}")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class Recorder:
    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: collections.Counter[str] = collections.Counter()

    async def timed(self, route: str, request: asyncio.Future[httpx.Response] | object) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = await request  # type: ignore[misc]
        except httpx.HTTPError as error:
            self.errors[f"{route}: {type(error).__name__}"] += 1
            return None
        self.latencies[route].append(time.perf_counter() - started)
        if not response.is_success:
            self.errors[f"{route}: HTTP {response.status_code}"] += 1
            return None
        return response


async def _client(base: str, key: str, workers: list[str], index: int, until: float, recorder: Recorder) -> None:
    """One user: a new root, then an input to one of its scope's worker sessions, until the end."""
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        n = 0
        while time.monotonic() < until:
            await recorder.timed("POST /sessions", http.post("/api/v1/sessions", json={"title": f"c{index}-{n}"}))
            target = workers[(index + n) % len(workers)]
            await recorder.timed("POST /sessions/{id}/inputs",
                                 http.post(f"/api/v1/sessions/{target}/inputs", json={"text": TASK}))
            n += 1


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def _report(recorder: Recorder, elapsed: float, clients: int, completed: str) -> int:
    everything = sorted(v for values in recorder.latencies.values() for v in values)
    total = len(everything) + sum(recorder.errors.values())
    print(f"\nclients {clients}, duration {elapsed:.1f} s, requests {total}")
    print(f"{'route':<30} {'count':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for route, values in sorted(recorder.latencies.items()):
        ordered = sorted(values)
        print(f"{route:<30} {len(ordered):>7} {_percentile(ordered, 0.5) * 1000:>8.1f} "
              f"{_percentile(ordered, 0.99) * 1000:>8.1f}")
    print(f"{'all':<30} {len(everything):>7} {_percentile(everything, 0.5) * 1000:>8.1f} "
          f"{_percentile(everything, 0.99) * 1000:>8.1f}")
    print(f"requests/s {total / elapsed:.1f}")
    print(f"errors {sum(recorder.errors.values())}" + (f" {dict(recorder.errors)}" if recorder.errors else ""))
    print(f"inputs completed by the actors meanwhile: {completed}")
    return 0 if not recorder.errors else 1


async def _completed_turns(base: str, admin_token: str | None) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=30, headers={"Authorization": f"Bearer {admin_token}"}) as http:
        text = (await http.get("/metrics")).text
    found = re.search(r'canopy_turns_ended_total\{status="completed"\} (\d+)', text)
    return found.group(1) if found else "0"


async def _keys(base: str, key: str, admin_token: str | None, scopes: int) -> list[str]:
    """The API keys of the scopes the clients spread over (the first is the given key)."""
    keys = [key]
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        for i in range(1, scopes):
            created = await admin.post("/api/v1/admin/keys", json={"user_id": f"bench-{i}", "app_id": "bench"})
            created.raise_for_status()
            keys.append(created.json()["api_key"])
    return keys


async def _workers(base: str, key: str, count: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        return [(await http.post("/api/v1/sessions", json={"title": f"worker {i}"})).json()["session"]["session_id"]
                for i in range(count)]


async def load(base: str, key: str, duration: float, clients: int, input_sessions: int, scopes: int = 1,
               admin_token: str | None = None) -> int:
    keys = await _keys(base, key, admin_token, scopes)
    workers = {k: await _workers(base, k, max(1, input_sessions // scopes)) for k in keys}
    recorder = Recorder()
    started = time.monotonic()
    await asyncio.gather(*(_client(base, keys[i % scopes], workers[keys[i % scopes]], i, started + duration, recorder)
                           for i in range(clients)))
    elapsed = time.monotonic() - started
    print(f"scopes {scopes} (every write takes its scope's event-cursor lock until commit)")
    return _report(recorder, elapsed, clients, await _completed_turns(base, admin_token))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--input-sessions", type=int, default=8, help="shared sessions that receive the inputs")
    parser.add_argument("--scopes", type=int, default=1, help="spread the clients over this many users "
                        "(default 1: all clients act as the one user canopy up prints a key for)")
    parser.add_argument("--replicas", type=int, default=1, help="API replicas of the canopy up it starts")
    parser.add_argument("--url", default=None, help="an already running API (else: start canopy up)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--admin-token", default=None, help="with --url: for --scopes > 1 and the metrics read")
    args = parser.parse_args()
    if args.url:
        if not args.api_key:
            parser.error("--url needs --api-key")
        return asyncio.run(load(args.url, args.api_key, args.duration, args.clients, args.input_sessions,
                                args.scopes, args.admin_token))
    up = CanopyUp(args.replicas)
    code = 1
    try:
        base, key, admin = up.wait_ready()
        print(f"canopy up ready at {base}", flush=True)
        code = asyncio.run(load(base, key, args.duration, args.clients, args.input_sessions, args.scopes, admin))
        return code
    finally:
        up.stop(keep_log=code != 0)


if __name__ == "__main__":
    sys.exit(main())
