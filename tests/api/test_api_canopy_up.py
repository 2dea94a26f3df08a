"""``canopy up`` in a subprocess, with a fresh data dir, a Ray temp dir of its own and free ports.

- It serves, its printed key works, it reports each startup step in order and prints no
  warning on a clean machine, and SIGINT leaves no Canopy, Ray or PostgreSQL process behind.
- Killed with ``kill -9`` (its whole process group) while a client holds a connection, it
  restarts at once on the same ports and data dir: the ports' TIME_WAIT does not block it, the
  killed run's Ray session is cleaned up and its embedded PostgreSQL reused, each said in a line.
- It refuses, in one line and with exit code 2, a database it cannot reach, a port in use, a
  ``--host`` this machine lacks and a data dir another ``canopy up`` serves; the port probe accepts
  TIME_WAIT and refuses a listener. On an IPv6 address its URLs are bracketed.
- The key it prints is the run's own: revoked when it stops, or by the next run after a crash; a key
  made through the admin API stays.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from actors.scripted import say, script
from api.up import LOOPBACK, port_free
from persistence.embedded import embedded_url, stop_embedded
from persistence.scopes import hash_key
from tests.api.helpers import clean_env
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 240.0
STEPS = ["database (embedded PostgreSQL) …", "Ray (local) …", "gateway …", "API (Serve on 127.0.0.1:", "ready ("]


class Up:
    """One ``canopy up`` subprocess in a process group of its own; its stdout lines as they come."""

    def __init__(self, root: Path, port: int, dashboard_port: int, *extra: str, env: dict[str, str] | None = None,
                 name: str = "up") -> None:
        self.root = root
        self.stderr_path = root / f"{name}.stderr"
        self._stderr = self.stderr_path.open("w")
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "up", "--port", str(port), "--dashboard-port", str(dashboard_port),
             "--data-dir", str(root / "data"), *extra],
            cwd=REPO, env=env or clean_env(root / "data", root / "ray"), stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> float:
        """Seconds until it printed its ready block."""
        began = time.monotonic()
        while not any("Press Ctrl-C" in line for line in self.lines):
            seen = self.output + "\n--- stderr ---\n" + self.stderr[-3000:]
            assert self.process.poll() is None, f"canopy up exited early ({self.process.returncode}):\n{seen}"
            assert time.monotonic() - began < timeout, f"canopy up did not start in time:\n{seen}"
            time.sleep(0.2)
        return time.monotonic() - began

    def processes(self) -> list[psutil.Process]:
        """canopy up, its descendants, and every process of its Ray session (found by the Ray temp dir)."""
        found = {self.process.pid: psutil.Process(self.process.pid)}
        found.update({p.pid: p for p in found[self.process.pid].children(recursive=True)})
        for proc in psutil.process_iter(["cmdline"]):
            if str(self.root / "ray") in " ".join(proc.info["cmdline"] or []):
                found.setdefault(proc.pid, proc)
        return list(found.values())

    def postmaster(self) -> psutil.Process:
        return psutil.Process(int((self.root / "data" / "pg" / "postmaster.pid").read_text().split()[0]))

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._stderr.close()


@pytest.fixture
def root() -> Iterator[Path]:
    # A short path: PostgreSQL's Unix socket lives in the data dir and socket paths are limited.
    path = Path(tempfile.mkdtemp(prefix="cnp-up-"))
    yield path
    for proc in psutil.process_iter(["cmdline"]):  # what a failed test left: only this test's processes
        if str(path) in " ".join(proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                proc.kill()
    shutil.rmtree(path, ignore_errors=True)


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


def _run_a_session(base: str, api_key: str, text: str) -> None:
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as http:
        assert http.get("/healthz").json() == {"status": "ok", "database": "ok", "ray": "ok"}
        created = http.post("/api/v1/sessions", json={"input": script(say(text))})
        assert created.status_code == 201, created.text
        input_id = created.json()["input"]["input_id"]
        deadline = time.monotonic() + 90
        while not (result := http.get(f"/api/v1/inputs/{input_id}/result").json())["terminal"]:
            assert time.monotonic() < deadline, result
            time.sleep(0.3)
        assert result["output"] == text


def _schedule_every_two_seconds(base: str, api_key: str) -> tuple[str, str]:
    """A root with a schedule every 2 s that catches up on every missed due time; (session, schedule)."""
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as http:
        session_id = http.post("/api/v1/sessions", json={"title": "ticks"}).json()["session"]["session_id"]
        made = http.post(f"/api/v1/sessions/{session_id}/schedules",
                         json={"every_seconds": 2, "text": script(say("tick")), "catch_up": "all"})
        assert made.status_code == 201, made.text
        return session_id, made.json()["schedule_id"]


def _scheduled_inputs(base: str, api_key: str, session_id: str) -> list[dict[str, object]]:
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as http:
        inputs = http.get(f"/api/v1/sessions/{session_id}/inputs", params={"limit": 1000}).json()
    return [i for i in inputs if i["origin"].get("kind") == "schedule"]


def _api_key(output: str) -> str:
    found = re.search(r"API key\s+(cnp_\S+)", output)
    assert found, output
    return found.group(1)


def _assert_it_serves_as_printed(up: Up, port: int) -> str:
    """Its ready block, its steps in order with their times, its tokens and a session; its API key."""
    output = up.output
    api_key = _api_key(output)
    dashboard = re.search(r"Dashboard\s+(http://\S+)", output)
    assert dashboard, output
    assert f"http://127.0.0.1:{port}/api/v1" in output
    assert f"UI         http://127.0.0.1:{port}/#key={api_key}" in output
    # Each step on a line of its own, in order, with how long it took.
    step_lines = [next(i for i, line in enumerate(up.lines) if line.strip().startswith(step)) for step in STEPS]
    assert step_lines == sorted(step_lines), output
    assert all(re.search(r"… ok \(\d+\.\d s\)$", up.lines[i]) for i in step_lines[:-1]), output
    # The operator learns where Ray's token is (the dashboard and the state API ask for it).
    assert re.search(r"Ray token\s+\S*auth_token\s+\(the dashboard asks for it; `ray get-auth-token`", output)
    admin = re.search(r"Admin\s+(adm_\S+)", output)
    assert admin, output
    # The generated admin token is printed once, and given to no process in its environment.
    assert output.count(admin.group(1)) == 1
    for child in psutil.Process(up.process.pid).children(recursive=True):
        with contextlib.suppress(OSError):
            assert admin.group(1) not in Path(f"/proc/{child.pid}/environ").read_text(errors="replace")
    _run_a_session(f"http://127.0.0.1:{port}", api_key, "up and running")
    with httpx.Client(timeout=30) as http:
        assert http.get(dashboard.group(1)).status_code == 200
    return api_key


# Serve's proxy warns when a replica answers its queue-length probe later than 0.1 s: a loaded
# machine, not a fault (the request still goes to the replica).
_LOAD = re.compile(r"Failed to get queue length from Replica\(.*\) within [0-9.]+s")


def _assert_warns_of_nothing(up: Up, *, but_recovering: str | None = None) -> None:
    """No warning on either stream (Canopy prints its own ones on purpose, as "canopy: WARNING",
    only for --expose-ray and the local sandbox), no traceback. After a crash the sweeper rightly
    warns of each Run the crash cut off that it recovers: ``but_recovering`` names the one session
    that may have had a Run in flight."""
    printed = up.output + "\n" + up.stderr
    warnings = [line for line in printed.splitlines() if "warning" in line.lower() and not _LOAD.search(line)]
    if but_recovering is not None:
        recovery = re.compile(rf"recovered run [0-9a-f-]{{36}} of session {but_recovering}\b")
        warnings = [line for line in warnings if not recovery.search(line)]
    assert warnings == [], printed
    assert "Traceback" not in printed


@pytest.mark.timeout(600)  # two starts of canopy up, each a Ray and a PostgreSQL: 100 s in CI, more when shared
def test_canopy_up_serves_restarts_at_once_after_kill_9_and_sigint_leaves_nothing_behind(root: Path) -> None:
    """One life of canopy up (each start costs a Ray and a PostgreSQL): it serves as it printed,
    warning of nothing on a clean machine; killed with ``kill -9`` while a client holds a
    connection, it restarts at once on its ports and data dir, adopting what the killed run left;
    SIGINT then stops everything both runs started. The key each run prints is that run's own: each
    run minted a new key that never expired (keys piled up, and any output ever printed gave access
    for good); the next run revokes the key the killed one printed, a clean stop its own, and a key
    made otherwise (here through the admin API) is never touched."""
    port, dashboard_port = free_port(), free_port()
    first = Up(root, port, dashboard_port, name="first")
    second = None
    try:
        first.wait_ready()
        base, first_key = f"http://127.0.0.1:{port}", _assert_it_serves_as_printed(first, port)
        _assert_warns_of_nothing(first)
        admins_key = _a_key_made_by_the_admin_api(base, first.output)
        assert _status(base, first_key) == _status(base, admins_key) == 200
        ticking, schedule_id = _schedule_every_two_seconds(base, first_key)
        deadline = time.monotonic() + 60
        while len(_scheduled_inputs(base, first_key, ticking)) < 2:  # fired before the crash
            assert time.monotonic() < deadline
            time.sleep(0.5)
        # A second canopy up on the same data dir is refused while the first serves it.
        other = subprocess.run([sys.executable, "-m", "api.cli", "up", "--port", str(free_port()), "--dashboard-port",
                                str(free_port()), "--data-dir", str(root / "data")], cwd=REPO, capture_output=True,
                               text=True, timeout=120, env=clean_env(root / "data", root / "other-ray"))
        assert other.returncode == 2, other
        assert f"another canopy up (pid {first.process.pid}) serves the data dir" in other.stderr
        assert not (root / "other-ray").exists()  # it started no Ray

        # A client holds a connection to the API while everything canopy up started is killed.
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: canopy\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):  # the whole response: nothing unread, so a close is not a reset
            answer += client.recv(65536)
        assert b'"status":"ok"' in answer
        killed = first.processes()
        proxy = [p for p in killed if "ProxyActor" in " ".join(p.cmdline())]
        assert proxy, [" ".join(p.cmdline())[:60] for p in killed]
        postmaster = first.postmaster()
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
        # Ray's workers (the proxy among them) follow their dead raylet; the server side of the
        # connection closes first, so once the client closes too, the API port is in TIME_WAIT.
        assert _eventually_none_alive(killed) == []
        assert client.recv(1) == b""
        client.close()
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # what the old probe did: refused for about a minute
        assert postmaster.is_running()  # the embedded PostgreSQL is a daemon: it outlived the crash

        second = Up(root, port, dashboard_port, name="second")
        seconds = second.wait_ready()
        print(f"\ncanopy up after kill -9: ready in {seconds:.1f} s (its steps: "
              f"{'; '.join(line.strip() for line in second.lines if ' ok (' in line)})")
        assert "already in use" not in second.stderr
        assert f"previous run (pid {first.process.pid}) ended without stopping: its Ray session" in second.output
        assert (f"previous run's embedded PostgreSQL (pid {postmaster.pid}) still runs: reusing it"
                in second.output), second.output
        assert second.postmaster().pid == postmaster.pid
        second_key = _api_key(second.output)
        assert "revoked 1 API key that earlier runs printed" in second.output, second.output
        assert _status(base, first_key) == 401
        assert _status(base, admins_key) == _status(base, second_key) == 200
        _run_a_session(f"http://127.0.0.1:{port}", second_key, "after the crash")
        # Each due time of the schedule, those missed while everything was down included, gave
        # exactly one input: consecutive due times 2 s apart, none twice, none skipped.
        # Five due times after the two before the crash: those missed while everything was down
        # (caught up at once), then the schedule's next ones.
        deadline = time.monotonic() + 60
        while len(_scheduled_inputs(base, _api_key(second.output), ticking)) < 2 + 5:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {_api_key(second.output)}"}) \
                as http:
            assert http.delete(f"/api/v1/sessions/{ticking}/schedules/{schedule_id}").status_code == 204
        due = sorted(datetime.datetime.fromisoformat(str(i["origin"]["due_at"]))
                     for i in _scheduled_inputs(base, _api_key(second.output), ticking))
        assert len(due) == len(set(due)) >= 2 + 5
        assert {(later - earlier).total_seconds() for earlier, later in itertools.pairwise(due)} == {2.0}

        # The second run owns what it adopted: SIGINT stops it all, the reused PostgreSQL included:
        # its process tree, its Ray session (Ray's head processes and workers) and the PostgreSQL.
        started = second.processes()
        assert any("raylet" in " ".join(p.cmdline()) for p in started)
        second.process.send_signal(signal.SIGINT)
        assert second.process.wait(timeout=120) == 0
        assert _eventually_none_alive([*started, postmaster]) == []
        assert not (root / "data" / "pg" / "postmaster.pid").exists()
        assert not (root / "data" / "canopy-up.json").exists()  # a clean stop leaves no record of a run
        leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]
        assert _alive(leftovers) == []
        assert "canopy: stopped" in second.output
        _assert_warns_of_nothing(second, but_recovering=ticking)
    finally:
        first.close()
        if second is not None:
            second.close()
    assert _revoked(root / "data", first_key, second_key, admins_key) == [True, True, False]


def _status(base: str, api_key: str) -> int:
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as http:
        return http.get("/api/v1/projects").status_code


def _revoked(data_dir: Path, *api_keys: str) -> list[bool]:
    """Whether each key's row says it is revoked, read from the data dir's embedded database (started
    for the reading when canopy up stopped it, and stopped again)."""
    try:
        with psycopg.connect(embedded_url(data_dir)) as conn:
            found = dict(conn.execute("SELECT key_hash, revoked_at IS NOT NULL FROM api_keys WHERE key_hash = ANY(%s)",
                                      ([hash_key(key) for key in api_keys],)).fetchall())
    finally:
        stop_embedded(data_dir)
    return [found[hash_key(key)] for key in api_keys]


def _a_key_made_by_the_admin_api(base: str, output: str) -> str:
    admin = re.search(r"Admin\s+(adm_\S+)", output)
    assert admin, output
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {admin.group(1)}"}) as http:
        made = http.post("/api/v1/admin/keys", json={"user_id": "local", "app_id": "canopy"})
    assert made.status_code == 201, made.text
    return str(made.json()["api_key"])


@pytest.mark.timeout(600)
def test_joining_a_cluster_it_leaves_no_serve_and_a_second_run_is_refused_in_one_line(
        root: Path, own_database_url: str) -> None:
    """Joining a Ray cluster, canopy up left the Serve it started running there (it deleted only its
    application): its proxy held the port, so the next canopy up was refused, and Serve ignores the
    HTTP options of a later start. A second run beside the first is refused in one line, changing
    nothing of the first's; the first, stopped, leaves no Serve behind. The first listens on ``::``,
    whose URLs it printed as ``http://:::8000``, which no browser or client takes: they are bracketed."""
    gcs_port, port = free_port(), free_port()
    cluster_env = {**clean_env(root / "data", root / "ray"), "RAY_AUTH_MODE": "token"}
    head = subprocess.run(["ray", "start", "--head", "--port", str(gcs_port), "--num-cpus", "2", "--temp-dir",
                           str(root / "ray"), "--include-dashboard=false", "--disable-usage-stats"],
                          env=cluster_env, capture_output=True, text=True, timeout=120)
    assert head.returncode == 0, head.stderr[-3000:]
    joined = {**cluster_env, "CANOPY_RAY_ADDRESS": f"127.0.0.1:{gcs_port}", "CANOPY_DATABASE_URL": own_database_url}
    first = Up(root, port, free_port(), "--host", "::", env=joined, name="first")
    try:
        first.wait_ready()
        api_key = _api_key(first.output)
        assert "Ray (joining 127.0.0.1:" in first.output
        assert f"API (Serve on [::]:{port}) … ok" in first.output, first.output
        assert f"API        http://[::]:{port}/api/v1   (reference: http://[::]:{port}/docs)" in first.output
        assert f"UI         http://[::]:{port}/#key={api_key}" in first.output, first.output
        assert ":::" not in first.output
        _run_a_session(f"http://[::1]:{port}", api_key, "joined over IPv6")
        other = port + 1 if port_free(LOOPBACK, port + 1) else free_port()
        second = subprocess.run([sys.executable, "-m", "api.cli", "up", "--port", str(other), "--data-dir",
                                 str(root / "data2")], cwd=REPO, capture_output=True, text=True, timeout=180,
                                env={**joined, "CANOPY_DATA_DIR": str(root / "data2")})
        assert second.returncode == 2, second
        assert f"canopy: a canopy up already serves this cluster (its API on [::]:{port})" in second.stderr
        _run_a_session(f"http://[::1]:{port}", api_key, "still serving")

        first.process.send_signal(signal.SIGINT)
        assert first.process.wait(timeout=120) == 0, first.output + first.stderr[-3000:]
        deadline = time.monotonic() + 30
        while not port_free("::", port):  # Serve's proxy went with the Serve it started
            assert time.monotonic() < deadline, f"the API's port {port} is still held after canopy up stopped"
            time.sleep(0.5)
    finally:
        first.close()


def test_an_unreachable_database_is_one_line_and_exit_code_2(root: Path) -> None:
    env = clean_env(root / "data", root / "ray")
    nobody = free_port()
    env["CANOPY_DATABASE_URL"] = f"postgresql://canopy:hunter2@127.0.0.1:{nobody}/canopy"
    done = subprocess.run([sys.executable, "-m", "api.cli", "up", "--port", str(free_port()), "--dashboard-port",
                           str(free_port()), "--data-dir", str(root / "data")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        f"canopy: cannot reach the database at postgresql://canopy@127.0.0.1:{nobody}/canopy (password hidden): "
        "connection refused — check CANOPY_DATABASE_URL"], done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    assert "database … failed" in done.stdout
    assert not (root / "ray").exists()  # it stopped before starting Ray


@pytest.mark.parametrize("taken", ["--port", "--dashboard-port"])
def test_a_port_in_use_is_one_line_naming_the_flag_and_exit_code_2(root: Path, taken: str) -> None:
    ports = {"--port": free_port(), "--dashboard-port": free_port()}
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports[taken]))
        listener.listen()
        done = subprocess.run([sys.executable, "-m", "api.cli", "up", "--port", str(ports["--port"]),
                               "--dashboard-port", str(ports["--dashboard-port"]), "--data-dir", str(root / "data")],
                              cwd=REPO, env=clean_env(root / "data", root / "ray"), capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("canopy: ") and f"127.0.0.1:{ports[taken]} is already in use" in line, line
    assert line.endswith(f"choose another with {taken}"), line
    assert not (root / "data" / "pg").exists() and not (root / "ray").exists()  # nothing was started


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--port", "70000", "70000 is not a TCP port (1 to 65535)"),
    ("--dashboard-port", "-1", "-1 is not a TCP port (1 to 65535)"),
    ("--host", "localhost", "'localhost' is not an IP address (127.0.0.1, ::1, 0.0.0.0)"),
    ("--replicas", "0", "0: at least 1"),
])
def test_a_flag_no_server_can_take_is_refused_before_anything_starts(root: Path, flag: str, value: str,
                                                                      says: str) -> None:
    """These ended in a traceback (an overflow binding the probe, a name the address parser does not
    take), --replicas 0 only once the database and Ray had started."""
    done = subprocess.run([sys.executable, "-m", "api.cli", "up", flag, value, "--data-dir", str(root / "data")],
                          cwd=REPO, env=clean_env(root / "data", root / "ray"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith(f"error: argument {flag}: {says}"), done
    assert "Traceback" not in done.stderr and not (root / "data").exists() and not (root / "ray").exists()


@pytest.mark.parametrize("host", ["192.0.2.1", "2001:db8::1"])  # documentation addresses: on no machine
def test_a_host_address_this_machine_lacks_is_said_so_and_nothing_starts(root: Path, host: str) -> None:
    """It was reported as the API's port being in use, naming a port nobody held."""
    done = subprocess.run([sys.executable, "-m", "api.cli", "up", "--host", host, "--port", str(free_port()),
                           "--dashboard-port", str(free_port()), "--data-dir", str(root / "data")], cwd=REPO,
                          env=clean_env(root / "data", root / "ray"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"canopy: --host {host} is not an address of this machine: choose one of its own"), line
    assert "in use" not in line and "Traceback" not in done.stdout + done.stderr
    # Refused before the data dir was locked or anything started: no lock, no database, no Ray.
    assert not (root / "data").exists() and not (root / "ray").exists()
    assert _alive([p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]) \
        == []


def test_the_port_probe_accepts_time_wait_and_refuses_a_listener() -> None:
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not port_free("127.0.0.1", port)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
    accepted.close()  # the server side closes first, as a killed server's kernel does ...
    assert client.recv(1) == b""
    client.close()  # ... so its end of the connection lingers in TIME_WAIT
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert port_free("127.0.0.1", port)


def test_empty_variables_are_unset_ones_and_a_default_model_without_its_key_is_one_line(root: Path) -> None:
    """``CANOPY_RAY_ADDRESS=`` and ``CANOPY_DATABASE_URL=`` were values "": canopy up took the database
    URL for configured and Ray for joined in one place, for local in another (a local Ray that the
    CLI had not kept on loopback). Empty, they are unset: the embedded PostgreSQL and a local Ray on
    loopback, as with neither set. Stopped at the model check, once both have started: a default
    model without its provider's key is one line naming the variable, and exit code 2."""
    env = clean_env(root / "data", root / "ray")
    del env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]  # the CLI sets it for a local Ray
    env.pop("GROQ_API_KEY", None)
    env.update({"CANOPY_RAY_ADDRESS": "", "CANOPY_DATABASE_URL": "", "DATABASE_URL": "", "CANOPY_ADMIN_TOKEN": "",
                "CANOPY_METRICS_TOKEN": "", "CANOPY_MODELS_FILE": "", "CANOPY_SECRETS_DIR": "",
                "CANOPY_DEFAULT_MODEL": "groq/llama-3.1-8b-instant"})
    done = subprocess.run([sys.executable, "-m", "api.cli", "up", "--port", str(free_port()), "--dashboard-port",
                           str(free_port()), "--data-dir", str(root / "data")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=START_TIMEOUT)
    assert done.returncode == 2, done
    assert "database (embedded PostgreSQL) … ok" in done.stdout and "Ray (local) … ok" in done.stdout, done
    [line] = [line for line in done.stderr.splitlines() if line.startswith("canopy: ")]
    assert line.startswith("canopy: the default model 'groq/llama-3.1-8b-instant' (CANOPY_DEFAULT_MODEL)"), line
    assert "needs GROQ_API_KEY" in line, line
    assert "Traceback" not in done.stdout + done.stderr and "Canopy is up" not in done.stdout, done
    assert "canopy: stopped" in done.stdout


def test_a_cluster_without_a_database_is_refused_before_anything_starts_with_exit_code_2(root: Path) -> None:
    """Joining a cluster on other machines with no CANOPY_DATABASE_URL: each node would start an
    embedded PostgreSQL of its own. Refused in one line and exit code 2, before the database step
    (which made and started the embedded server, exit code 1)."""
    env = clean_env(root / "data", root / "ray")
    env["CANOPY_RAY_ADDRESS"] = "ray://192.0.2.1:10001"  # TEST-NET-1: nothing answers there
    done = subprocess.run([sys.executable, "-m", "api.cli", "up", "--port", str(free_port()), "--dashboard-port",
                           str(free_port()), "--data-dir", str(root / "data")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("canopy: CANOPY_RAY_ADDRESS ray://192.0.2.1:10001 is a Ray Client address") and \
        "Set CANOPY_DATABASE_URL" in line, line
    assert "database …" not in done.stdout, done.stdout
    assert not (root / "data" / "pg").exists() and not (root / "ray").exists()


def test_expose_ray_without_rays_token_authentication_is_refused_before_anything_starts(root: Path) -> None:
    """--expose-ray opens Ray (a code-execution service) beyond loopback; with RAY_AUTH_MODE=disabled
    anyone who reaches it runs code here. That was a warning, and Ray started all the same."""
    env = {**clean_env(root / "data", root / "ray"), "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "api.cli", "up", "--expose-ray", "--port", str(free_port()),
                           "--dashboard-port", str(free_port()), "--data-dir", str(root / "data")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("canopy: --expose-ray needs Ray's token authentication") and "RAY_AUTH_MODE" in line, line
    assert not (root / "data").exists() and not (root / "ray").exists()
