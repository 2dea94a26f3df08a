"""``canopy up --host 0.0.0.0`` exposes only the API, and keeps its secrets out of reach.

One ``canopy up`` runs as a subprocess with a data dir and a Ray temp dir of its own, an
operator-chosen admin token and metrics token, and a database URL that carries a password
(a database on the test session's PostgreSQL; its trust authentication ignores the
password, which is only there to be looked for). Then, over every process it started (its
process tree, and every Ray process of its session, identified by the Ray temp dir in their
command lines):

- the only listening socket beyond loopback is the API's port;
- no secret is in any process's environment (but the ``canopy up`` process's own, which is
  the operator's shell's) or command line, in what ``canopy up`` printed, in Ray's session
  files (its logs, which record runtime_envs) or in the data dir (but its secrets directory,
  0700 with 0600 files);
- and the actors still reach the database: a session runs to its result.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from psycopg.conninfo import make_conninfo

from actors.scripted import say, script
from persistence.databases import create_database, drop_database
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 240.0
# One worker runs the module's tests: the fixture's canopy up is started once, not once per worker.
pytestmark = pytest.mark.xdist_group("api-exposure")


@dataclass
class Started:
    process: subprocess.Popen[str]
    port: int
    root: Path  # data dir, Ray temp dir and logs
    output: list[str]
    api_key: str
    secrets: dict[str, str]  # name -> value that must not leak

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def ray_dir(self) -> Path:
        return self.root / "ray"

    def processes(self) -> list[psutil.Process]:
        """canopy up, its descendants, and every process of its Ray session (some are reparented)."""
        found = {self.process.pid: psutil.Process(self.process.pid)}
        found.update({p.pid: p for p in found[self.process.pid].children(recursive=True)})
        for proc in psutil.process_iter(["cmdline"]):
            if str(self.ray_dir) in " ".join(proc.info["cmdline"] or []):
                found.setdefault(proc.pid, proc)
        return list(found.values())


def _read_lines(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))


@pytest.fixture(scope="module")
def exposed(database_url: str) -> Iterator[Started]:
    root = Path(tempfile.mkdtemp(prefix="cnp-x-"))  # short: Unix socket paths live under it
    password = "pw-" + secrets.token_hex(12)
    url = create_database(database_url, "canopy_exposed")
    secret_values = {"admin token": "adm-" + secrets.token_hex(16), "metrics token": "met-" + secrets.token_hex(16),
                     "database password": password}
    # Nothing of the test session's settings, and not the variable that keeps Ray on loopback:
    # canopy up must see to that itself.
    env = {key: value for key, value in os.environ.items() if not key.startswith("CANOPY_")
           and key not in ("RAY_ADDRESS", "RAY_NAMESPACE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env.update({"CANOPY_DATABASE_URL": make_conninfo(url, password=password),
                "CANOPY_ADMIN_TOKEN": secret_values["admin token"],
                "CANOPY_METRICS_TOKEN": secret_values["metrics token"],
                "RAY_TMPDIR": str(root / "ray"), "PYTHONUNBUFFERED": "1"})
    port = free_port()
    stderr = (root / "stderr.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "up", "--host", "0.0.0.0", "--port", str(port),
         "--dashboard-port", str(free_port()), "--data-dir", str(root / "data")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines: list[str] = []
    threading.Thread(target=_read_lines, args=(process, lines), daemon=True).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not any("Press Ctrl-C" in line for line in lines):
            seen = "\n".join(lines) + "\n--- stderr ---\n" + (root / "stderr.log").read_text()[-3000:]
            assert process.poll() is None, f"canopy up exited early ({process.returncode}):\n{seen}"
            assert time.monotonic() < deadline, f"canopy up did not start in time:\n{seen}"
            time.sleep(0.2)
        api_key = re.search(r"API key\s+(cnp_\S+)", "\n".join(lines))
        assert api_key, lines
        yield Started(process, port, root, lines, api_key.group(1), secret_values)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.close()
        drop_database(url)
        shutil.rmtree(root, ignore_errors=True)


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_actors_reach_the_database_without_secrets_in_their_environment(exposed: Started) -> None:
    base = f"http://127.0.0.1:{exposed.port}"
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {exposed.api_key}"}) as http:
        assert http.get("/healthz").json() == {"status": "ok", "database": "ok", "ray": "ok"}
        created = http.post("/api/v1/sessions", json={"input": script(say("reached the database"))})
        assert created.status_code == 201, created.text
        input_id = created.json()["input"]["input_id"]
        deadline = time.monotonic() + 90
        while not (result := http.get(f"/api/v1/inputs/{input_id}/result").json())["terminal"]:
            assert time.monotonic() < deadline, result
            time.sleep(0.3)
        assert result["output"] == "reached the database"
        # The operator's tokens work where they should: the Serve replicas read them from files.
        metrics_token = exposed.secrets["metrics token"]
        assert http.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"}).status_code == 200


def test_only_the_api_listens_beyond_loopback(exposed: Started) -> None:
    processes = exposed.processes()
    names = " ".join(" ".join(p.cmdline()) for p in processes)
    assert "raylet" in names and "gcs_server" in names and "dashboard" in names, names
    pids = {p.pid for p in processes}
    listening = [(c.laddr.ip, c.laddr.port, c.pid) for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert any(port == exposed.port for _, port, _ in listening), listening
    exposed_beyond = {(ip, port) for ip, port, _ in listening if not _is_loopback(ip)}
    assert {port for _, port in exposed_beyond} == {exposed.port}, [
        (ip, port, " ".join(psutil.Process(pid).cmdline())[:100]) for ip, port, pid in listening
        if not _is_loopback(ip)]


def _leaks(text: str, found_in: str, values: dict[str, str]) -> list[str]:
    return [f"{name} in {found_in}" for name, value in values.items() if value in text]


def test_no_secret_in_process_environments_or_command_lines(exposed: Started) -> None:
    leaks: list[str] = []
    processes = exposed.processes()
    titles = [" ".join(p.cmdline()) for p in processes]
    for actor in ("ServeReplica", "ProxyActor", "AccountedGateway", "SweeperImpl", "gcs_server", "raylet"):
        assert any(actor in title for title in titles), (actor, [title[:80] for title in titles])
    for proc in processes:
        try:
            cmdline = "\0".join(proc.cmdline())
            where = f"{proc.pid} {proc.name()}"
            leaks += _leaks(cmdline, f"the command line of {where}", exposed.secrets)
            if proc.pid != exposed.process.pid:  # canopy up's own environment is the operator's shell's
                environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
                leaks += _leaks(environ, f"the environment of {where}", exposed.secrets)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    assert leaks == []


def test_no_secret_in_output_logs_or_files(exposed: Started) -> None:
    printed = "\n".join(exposed.output) + (exposed.root / "stderr.log").read_text()
    leaks = _leaks(printed, "what canopy up printed", exposed.secrets)
    secrets_dir = exposed.data_dir / "secrets"
    for base in (exposed.ray_dir, exposed.data_dir):
        for path in base.rglob("*"):
            if path.is_file() and not path.is_socket() and secrets_dir not in path.parents:
                try:
                    text = path.read_bytes().decode(errors="replace")
                except OSError:
                    continue
                leaks += _leaks(text, str(path.relative_to(exposed.root)), exposed.secrets)
    assert leaks == []
    # Where the secrets are: readable by the runtime's user only.
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    files = list(secrets_dir.iterdir())
    assert files and all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
