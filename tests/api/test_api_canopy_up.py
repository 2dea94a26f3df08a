"""``canopy up`` in a subprocess: a fresh data dir and free ports; it serves, its printed key works,
and SIGINT leaves no Canopy, Ray or PostgreSQL process behind."""

from __future__ import annotations

import contextlib
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
import psutil

from actors.scripted import say, script
from tests.api.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 240.0


def _clean_env(data_dir: Path) -> dict[str, str]:
    """No test settings and no pointer to the test's own Ray cluster: ``canopy up`` starts its own."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("CANOPY_") and key not in ("RAY_ADDRESS", "RAY_NAMESPACE")}
    env.update({"CANOPY_DATA_DIR": str(data_dir), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"})
    return env


def _read_until_ready(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))


def _wait_for(lines: list[str], marker: str, process: subprocess.Popen[str], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not any(marker in line for line in lines):
        seen = "\n".join(lines) + "\n--- stderr ---\n" + log.read_text()[-3000:]
        assert process.poll() is None, f"canopy up exited early ({process.returncode}):\n{seen}"
        assert time.monotonic() < deadline, f"canopy up did not start in time:\n{seen}"
        time.sleep(0.2)


def _alive(processes: list[psutil.Process]) -> list[str]:
    alive = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return alive


def _eventually_none_alive(processes: list[psutil.Process], timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (alive := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def test_canopy_up_serves_and_sigint_leaves_nothing_behind() -> None:
    # A short path: PostgreSQL's Unix socket lives in the data dir and socket paths are limited.
    data_dir = Path(tempfile.mkdtemp(prefix="cnp-up-"))
    port, dashboard_port = free_port(), free_port()
    stderr = (data_dir / "stderr.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "up", "--port", str(port), "--dashboard-port", str(dashboard_port),
         "--data-dir", str(data_dir / "data")],
        cwd=REPO, env=_clean_env(data_dir / "data"), stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines: list[str] = []
    threading.Thread(target=_read_until_ready, args=(process, lines), daemon=True).start()
    try:
        _wait_for(lines, "Press Ctrl-C", process, START_TIMEOUT, data_dir / "stderr.log")
        output = "\n".join(lines)
        api_key = re.search(r"API key\s+(cnp_\S+)", output)
        dashboard = re.search(r"Dashboard\s+(http://\S+)", output)
        assert api_key and dashboard, output
        assert f"http://127.0.0.1:{port}/api/v1" in output
        assert f"UI         http://127.0.0.1:{port}/#key={api_key.group(1)}" in output
        admin = re.search(r"Admin\s+(adm_\S+)", output)
        assert admin, output
        # The generated admin token is printed once, and given to no process in its environment.
        assert output.count(admin.group(1)) == 1
        for child in psutil.Process(process.pid).children(recursive=True):
            with contextlib.suppress(OSError):
                assert admin.group(1) not in Path(f"/proc/{child.pid}/environ").read_text(errors="replace")
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.get("/healthz").json() == {"status": "ok", "database": "ok", "ray": "ok"}
            assert http.get("/").status_code == 200
            assert http.get(dashboard.group(1), timeout=30).status_code == 200
            authed = {"Authorization": f"Bearer {api_key.group(1)}"}
            created = http.post("/api/v1/sessions", headers=authed, json={"input": script(say("up and running"))})
            assert created.status_code == 201, created.text
            input_id = created.json()["input"]["input_id"]
            deadline = time.monotonic() + 90
            while not (result := http.get(f"/api/v1/inputs/{input_id}/result", headers=authed).json())["terminal"]:
                assert time.monotonic() < deadline, result
                time.sleep(0.3)
            assert result["output"] == "up and running"

        # Everything this canopy up started: its process tree (Ray's head processes and workers,
        # which Ray starts as descendants) and the embedded PostgreSQL (a daemon of its own).
        started = psutil.Process(process.pid).children(recursive=True)
        assert any("raylet" in " ".join(p.cmdline()) for p in started)
        postmaster = psutil.Process(int((data_dir / "data" / "pg" / "postmaster.pid").read_text().split()[0]))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
        assert _eventually_none_alive([*started, postmaster]) == []
        assert not (data_dir / "data" / "pg" / "postmaster.pid").exists()
        leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(data_dir) in " ".join(p.info["cmdline"] or [])]
        assert _alive(leftovers) == []
        assert "canopy: stopped" in "\n".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.close()
        shutil.rmtree(data_dir, ignore_errors=True)
