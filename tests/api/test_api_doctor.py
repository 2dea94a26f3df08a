"""``canopy doctor`` as a subprocess, with a data dir and a Ray temp dir of its own.

On what CI provides (a Docker engine and the test image, the scripted model, a fresh data dir
whose embedded PostgreSQL the doctor starts) every check is OK and the exit code is 0, and the
doctor leaves nothing running. With a database that does not answer, an image that is not there
and a provider's model without its key, it names the three problems (the password hidden), skips
what needs the database, and exits 1. The model check with the key present runs in this process.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from api.doctor import Doctor, Problem, Unverified
from persistence.migrations import latest_version
from persistence.settings import Settings
from sandbox.base import SandboxUnavailable
from sandbox.docker_backend import connect
from tests.api.helpers import clean_env
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CHECKS = ["database", "schema", "Ray", "Docker", "sandbox image", "sandbox memory", "workdir disk", "model"]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cnp-dr-"))  # short: the embedded PostgreSQL's socket lives under it
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def docker_engine() -> None:
    try:
        connect().close()
    except SandboxUnavailable:
        pytest.skip("no Docker engine answers (start one with: bash .ci/docker-up.sh)")


def doctor(root: Path, umask: int = -1, **settings: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Exit code, {check: (status, detail)}, and everything it printed."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("CANOPY_") and key not in ("RAY_ADDRESS", "RAY_NAMESPACE", "OPENAI_API_KEY")}
    env.update({"CANOPY_DATA_DIR": str(root / "data"), "RAY_TMPDIR": str(root / "ray"), "PYTHONUNBUFFERED": "1",
                "CANOPY_SANDBOX_IMAGE": "canopy-sandbox:latest", **settings})
    done = subprocess.run([sys.executable, "-m", "api.cli", "doctor"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, umask=umask)
    printed = done.stdout + done.stderr
    found = {}
    for line in done.stdout.splitlines():
        match = re.match(rf"(OK|FAIL|SKIP|NOTE)\s+({'|'.join(CHECKS)})\s+(.*)", line)
        if match:
            found[match.group(2)] = (match.group(1), match.group(3))
    return done.returncode, found, printed


def _engine_memory() -> str:
    client = connect()
    try:
        return f"{client.info()['MemTotal'] / 2**30:.1f} GiB"
    finally:
        client.close()


def _processes_under(path: Path) -> list[str]:
    alive = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(path) in " ".join(proc.info["cmdline"] or []):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(proc.info["cmdline"])[:100])
            except psutil.NoSuchProcess:
                continue
    return alive


def _eventually_nothing_under(path: Path, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (alive := _processes_under(path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def test_doctor_says_all_ok_on_what_ci_provides_and_leaves_nothing_running(root: Path, docker_engine: None) -> None:
    """Also: the doctor started Ray directly, which wrote ``~/.ray/auth_token`` with the umask (0644:
    every local user's, and whoever reads it may run code on the cluster), and canopy up went on
    using it; the doctor's Ray writes a missing token its owner's only. And ``CANOPY_RAY_ADDRESS=``
    was an address "" to the database check (which then could not read the cluster "" and refused
    the embedded database) and none to the Ray check: empty variables are unset ones."""
    token = root / "home" / ".ray" / "auth_token"
    code, found, printed = doctor(root, umask=0o022, HOME=str(root / "home"), CANOPY_RAY_ADDRESS="",
                                  CANOPY_DATABASE_URL="", DATABASE_URL="", CANOPY_SANDBOX_MAX_CONTAINERS="4",
                                  CANOPY_SANDBOX_MEMORY="512m")
    assert code == 0, printed
    assert list(found) == CHECKS, printed
    assert {status for status, _ in found.values()} == {"OK"}, printed
    assert printed.rstrip().endswith("all OK"), printed
    assert "the embedded PostgreSQL" in found["database"][1], printed
    assert "started for this check, then stopped" in found["database"][1]
    assert found["schema"][1] == f"none yet: canopy up creates it (version {latest_version()})"
    assert f"token in {token}" in found["Ray"][1] and "a local Ray starts" in found["Ray"][1], found["Ray"]
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and re.fullmatch("[0-9a-f]{64}", token.read_text())
    assert "canopy-sandbox:latest present" in found["sandbox image"][1]
    assert found["sandbox memory"][1].startswith(f"4 sandboxes of 512 MiB fit in the engine's {_engine_memory()}"), \
        found["sandbox memory"]
    assert found["workdir disk"][1].startswith("10240 MiB per project workdir"), found["workdir disk"]
    assert "built in" in found["model"][1]
    assert "Traceback" not in printed and "warning" not in printed.lower(), printed
    # It stopped what it started: the embedded PostgreSQL and its own Ray.
    assert not (root / "data" / "pg" / "postmaster.pid").exists()
    assert _eventually_nothing_under(root) == []


def test_doctor_names_an_unreachable_database_a_missing_image_and_a_missing_key(root: Path,
                                                                               docker_engine: None) -> None:
    port = free_port()
    code, found, printed = doctor(root, CANOPY_DATABASE_URL=f"postgresql://canopy:hunter2@127.0.0.1:{port}/canopy",
                                  CANOPY_SANDBOX_IMAGE="canopy-sandbox-absent:latest",
                                  CANOPY_DEFAULT_MODEL="openai/gpt-4o-mini", CANOPY_SANDBOX_MAX_CONTAINERS="1000")
    assert code == 1, printed
    assert found["database"] == ("FAIL", f"cannot reach the database at postgresql://canopy@127.0.0.1:{port}/canopy "
                                         "(password hidden): connection refused — check CANOPY_DATABASE_URL"), printed
    assert found["schema"] == ("SKIP", "needs the database")
    assert found["sandbox image"][0] == "FAIL"
    assert "canopy-sandbox-absent:latest (CANOPY_SANDBOX_IMAGE) is not on the engine: pull or build it" in \
        found["sandbox image"][1]
    assert found["model"][0] == "FAIL" and "OPENAI_API_KEY" in found["model"][1], printed  # a provider's, no key
    assert found["Ray"][0] == found["Docker"][0] == "OK", printed
    # A note, not a failure: limits are ceilings, and a sandbox's processes go first (oom_score_adj).
    assert found["sandbox memory"] == ("NOTE", f"1000 sandboxes of 2 GiB (CANOPY_SANDBOX_MAX_CONTAINERS × "
                                               f"CANOPY_SANDBOX_MEMORY) may take 2000 GiB, more than the engine's "
                                               f"{_engine_memory()}: when the node runs out of memory the kernel "
                                               "kills a sandbox's processes first (their OOM score adjustment is "
                                               "1000); lower either setting to keep them within it"), printed
    assert printed.rstrip().endswith("not OK: database, schema, sandbox image, model"), printed
    assert "hunter2" not in printed and "Traceback" not in printed
    assert _eventually_nothing_under(root) == []


def test_doctor_checks_a_provider_model_for_its_key_without_calling_it(root: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The model check alone, in this process (the subprocess runs above cover the doctor's whole
    run, a provider model without its key included): it passes once the key is in the secrets
    directory, makes no request, and never prints the key."""
    # The gateway puts a key it finds into this process's environment: recorded here, so that the
    # variable is taken away again after the test (delenv alone records nothing when it is unset).
    monkeypatch.setenv("OPENAI_API_KEY", "")
    monkeypatch.delenv("OPENAI_API_KEY")
    settings = Settings(default_model="openai/gpt-4o-mini", data_dir=root / "data")
    with pytest.raises(Problem, match="OPENAI_API_KEY"):
        Doctor(settings).model()

    secrets = root / "data" / "secrets"  # where the runtime's model gateways read provider keys
    secrets.mkdir(parents=True)
    (secrets / "OPENAI_API_KEY").write_text("sk-doctor-test-not-a-key")
    found = Doctor(settings).model()
    assert found == "openai/gpt-4o-mini (CANOPY_DEFAULT_MODEL): litellm has its key and endpoint (not called)"
    assert "sk-doctor-test" not in found


def test_doctor_probes_a_workdirs_disk_and_leaves_none(root: Path) -> None:
    """The quota's probe mounts a workdir's disk under the data dir and takes it away again; with the
    quota off, the doctor says what that leaves open."""
    settings = Settings(data_dir=root / "data", sandbox_workdir_mb=16)
    if os.geteuid() == 0:
        assert Doctor(settings).workdir_disk().startswith("16 MiB per project workdir")
        projects = root / "data" / "projects"
        assert list(projects.iterdir()) == [] and str(projects) not in Path("/proc/self/mountinfo").read_text()
    with pytest.raises(Unverified, match="CANOPY_SANDBOX_WORKDIR_MB=0"):
        Doctor(settings.model_copy(update={"sandbox_workdir_mb": 0})).workdir_disk()


@pytest.mark.parametrize(("settings", "says"), [
    ({"CANOPY_TREE_SLOTS": "0"}, "CANOPY_TREE_SLOTS: Input should be greater than or equal to 1"),
    ({"CANOPY_PROVIDER_ENV": "not json"}, 'error parsing value for field "provider_env"'),
    ({"CANOPY_SANDBOX_MEMORY": "2 GiB"}, "CANOPY_SANDBOX_MEMORY: String should match pattern"),
])
def test_a_setting_no_value_can_have_is_named_not_a_traceback(root: Path, settings: dict[str, str],
                                                               says: str) -> None:
    code, _, printed = doctor(root, **settings)
    assert code == 2 and f"canopy: invalid settings: {says}" in printed, printed
    assert "Traceback" not in printed and not (root / "data").exists()


def test_doctor_refuses_the_embedded_database_for_a_cluster_as_canopy_up_does(root: Path) -> None:
    """Joining a Ray cluster with no CANOPY_DATABASE_URL, canopy up refuses (each node would start a
    PostgreSQL of its own); the doctor started the embedded one and said the database was OK. Only the
    database check, in a process of its own: this one may be connected to a one-node Ray, which needs
    no shared database, and through the CLI the Ray check waits ~30 s for the cluster that is not there."""
    check = "from api.doctor import Doctor; from persistence.settings import Settings; Doctor(Settings()).database()"
    env = {**clean_env(root / "data", root / "ray"), "CANOPY_RAY_ADDRESS": "ray://127.0.0.1:1"}
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SharedDatabaseRequired" in done.stderr and "Set CANOPY_DATABASE_URL" in done.stderr, done.stderr
    assert not (root / "data" / "pg").exists()


def test_doctor_reports_a_ray_token_others_could_read_and_leaves_it(root: Path) -> None:
    """A token others could read is reported (canopy up replaces it), not replaced: a diagnosis must
    not cut a running cluster's clients off. (A missing one it writes its owner's only: above.)"""
    home = root / "home"
    token = home / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text("0" * 64)
    token.chmod(0o644)
    code, found, printed = doctor(root, umask=0o022, HOME=str(home), CANOPY_SANDBOX_BACKEND="local",
                                  CANOPY_SANDBOX_WORKDIR_MB="0")
    assert code == 0 and "could be read by other users" in found["Ray"][1] and "canopy up replaces it" in printed
    assert token.read_text() == "0" * 64 and stat.S_IMODE(token.stat().st_mode) == 0o644
    assert _eventually_nothing_under(root) == []
