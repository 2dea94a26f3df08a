"""The secrets directory a runtime writes (actors/runtime.py ``_write_secrets``) is also where an
operator puts a cluster's secrets (cluster.yaml, the README: ``CANOPY_SECRETS_DIR`` is
``<data dir>/secrets``). A runtime started there without them (no ``CANOPY_SECRETS_DIR``, so with no
tokens and the embedded database) removed the operator's tokens and replaced their database URL.
Canopy now changes only the files it wrote itself, and refuses to run with a secret that differs
from the operator's file of it, and keeps its record of the files it wrote right when runtimes start
at once or one is killed midway. Real files, real processes and real ``Settings``; no Ray, no
database (the URLs are only written)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from actors.runtime import worker_env
from persistence.errors import Conflict
from persistence.settings import GENERATED_ADMIN_TOKEN_PREFIX, Settings

REPO = Path(__file__).resolve().parents[2]
OPERATORS_URL = "postgresql://canopy:op-password@db.example:5432/canopy"
EMBEDDED_URL = "postgresql://postgres:@/postgres?host=/tmp/canopy-pg-x"


def _snapshot(directory: Path) -> dict[str, tuple[str, int, int]]:
    """Every file of the directory: its content, mode and modification time."""
    return {path.name: (path.read_text(), path.stat().st_mode, path.stat().st_mtime_ns)
            for path in directory.iterdir()}


@pytest.fixture
def operators_secrets(tmp_path: Path) -> Path:
    """``<data dir>/secrets`` as cluster.yaml lays it out: the operator's database URL and admin token."""
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    for name, value in (("canopy_database_url", OPERATORS_URL), ("canopy_admin_token", "operators-admin-token-1")):
        (directory / name).write_text(value)
        (directory / name).chmod(0o600)
    return directory


def test_a_runtime_with_another_database_is_refused_and_changes_nothing(operators_secrets: Path) -> None:
    before = _snapshot(operators_secrets)
    settings = Settings(data_dir=operators_secrets.parent, admin_token=None, metrics_token=None)
    with pytest.raises(Conflict, match=r"canopy_database_url .* another database .* CANOPY_SECRETS_DIR"):
        worker_env(settings, EMBEDDED_URL)
    assert _snapshot(operators_secrets) == before


def test_a_runtime_with_another_admin_token_is_refused_and_changes_nothing(operators_secrets: Path) -> None:
    before = _snapshot(operators_secrets)
    settings = Settings(data_dir=operators_secrets.parent, admin_token=SecretStr("a-token-of-this-runtime"))
    with pytest.raises(Conflict, match=r"canopy_admin_token .* CANOPY_ADMIN_TOKEN") as refused:
        worker_env(settings, OPERATORS_URL)
    assert "operators-admin-token-1" not in str(refused.value) and "a-token-of-this" not in str(refused.value)
    assert _snapshot(operators_secrets) == before


def test_the_operators_files_stay_and_canopys_own_come_and_go(operators_secrets: Path) -> None:
    """A runtime of the operator's database with no admin token of its own leaves theirs; a metrics
    token it has is written, and removed by the next runtime that has none, as Canopy wrote it. A file
    of Canopy's that the operator rewrote is theirs from then on."""
    data_dir = operators_secrets.parent
    operators = _snapshot(operators_secrets)
    env = worker_env(Settings(data_dir=data_dir, admin_token=None, metrics_token=SecretStr("metrics-token-000001")),
                     OPERATORS_URL)
    assert env["CANOPY_SECRETS_DIR"] == str(operators_secrets)
    after = _snapshot(operators_secrets)
    assert {name: after[name] for name in operators} == operators
    assert (operators_secrets / "canopy_metrics_token").read_text() == "metrics-token-000001"
    assert (after["canopy_metrics_token"][1] & 0o777) == 0o600

    worker_env(Settings(data_dir=data_dir, admin_token=None, metrics_token=SecretStr("metrics-token-000002")),
               OPERATORS_URL)
    assert (operators_secrets / "canopy_metrics_token").read_text() == "metrics-token-000002"
    worker_env(Settings(data_dir=data_dir, admin_token=None, metrics_token=None), OPERATORS_URL)
    assert not (operators_secrets / "canopy_metrics_token").exists()

    worker_env(Settings(data_dir=data_dir, admin_token=None, metrics_token=SecretStr("metrics-token-000003")),
               OPERATORS_URL)
    (operators_secrets / "canopy_metrics_token").write_text("operators-metrics-token")
    worker_env(Settings(data_dir=data_dir, admin_token=None, metrics_token=None), OPERATORS_URL)
    assert (operators_secrets / "canopy_metrics_token").read_text() == "operators-metrics-token"
    assert {name: _snapshot(operators_secrets)[name] for name in operators} == operators
    assert not [name for name in os.listdir(operators_secrets) if name.startswith(".canopy_")]  # nothing aside


def test_a_fresh_data_dir_gets_the_runtimes_secrets_and_the_next_runtime_replaces_them(tmp_path: Path) -> None:
    """Canopy's own files, as before: the last runtime started on a data dir wrote what its workers read."""
    first = Settings(data_dir=tmp_path, admin_token=SecretStr("first-admin-token-01"))
    directory = Path(worker_env(first, EMBEDDED_URL)["CANOPY_SECRETS_DIR"])
    assert (directory / "canopy_admin_token").read_text() == "first-admin-token-01"
    worker_env(Settings(data_dir=tmp_path, admin_token=SecretStr("second-admin-token-2")), EMBEDDED_URL + "2")
    assert (directory / "canopy_admin_token").read_text() == "second-admin-token-2"
    assert (directory / "canopy_database_url").read_text() == EMBEDDED_URL + "2"


def test_a_data_dir_a_canopy_before_the_record_wrote_is_taken_over(tmp_path: Path) -> None:
    """A data dir a Canopy before ``.canopy-written`` served holds its embedded database's URL (whose
    socket has moved since) and the admin token its canopy up made: both were Canopy's, so the next
    runtime replaces them instead of refusing to start on every machine that upgrades."""
    (tmp_path / "pg").mkdir()
    (tmp_path / "pg" / "PG_VERSION").write_text("16\n")  # its embedded database
    (tmp_path / "canopy-up.lock").write_text("4242")  # a canopy up served it
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    earlier = {"canopy_database_url": "postgresql://postgres:@/postgres?host=/tmp/8a1f33c0e2b4",
               "canopy_admin_token": GENERATED_ADMIN_TOKEN_PREFIX + "earlier-run-token-0123456789ab"}
    for name, value in earlier.items():
        (directory / name).write_text(value)
        (directory / name).chmod(0o600)
    settings = Settings(data_dir=tmp_path, admin_token=SecretStr(GENERATED_ADMIN_TOKEN_PREFIX + "this-run-token-01"))
    worker_env(settings, EMBEDDED_URL)
    assert (directory / "canopy_database_url").read_text() == EMBEDDED_URL
    assert (directory / "canopy_admin_token").read_text() == GENERATED_ADMIN_TOKEN_PREFIX + "this-run-token-01"


def test_an_operators_local_socket_database_is_not_taken_for_an_embedded_one(operators_secrets: Path) -> None:
    (operators_secrets / "canopy_database_url").write_text("postgresql://canopy:pw@/canopy?host=/var/run/postgresql")
    before = _snapshot(operators_secrets)
    with pytest.raises(Conflict, match="canopy_database_url"):
        worker_env(Settings(data_dir=operators_secrets.parent, admin_token=None, metrics_token=None), EMBEDDED_URL)
    assert _snapshot(operators_secrets) == before


def test_a_joined_clusters_workers_get_the_span_exporters_settings_but_not_its_headers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers of a joined cluster get only the runtime_env's variables: with CANOPY_OTEL_EXPORTER=otlp
    # and no endpoint, their spans went to localhost:4318, nowhere.
    monkeypatch.setenv("CANOPY_OTEL_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer collector-secret")
    env = worker_env(Settings(data_dir=tmp_path, admin_token=None, metrics_token=None), EMBEDDED_URL)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://collector.example:4318"
    assert env["CANOPY_OTEL_EXPORTER"] == "otlp"
    assert "collector-secret" not in repr(env)


def test_an_operators_token_of_canopy_ups_form_is_not_taken_over(operators_secrets: Path) -> None:
    # The README's recipe makes an operator's admin token of the form canopy up gives its own; with
    # no canopy up ever run on the data dir, it is the operator's.
    (operators_secrets / "canopy_admin_token").write_text(GENERATED_ADMIN_TOKEN_PREFIX + "operators-made-0001")
    (operators_secrets.parent / "pg").mkdir()
    (operators_secrets.parent / "pg" / "PG_VERSION").write_text("16\n")
    before = _snapshot(operators_secrets)
    with pytest.raises(Conflict, match="canopy_admin_token"):
        worker_env(Settings(data_dir=operators_secrets.parent,
                            admin_token=SecretStr(GENERATED_ADMIN_TOKEN_PREFIX + "this-run-token-01")), OPERATORS_URL)
    worker_env(Settings(data_dir=operators_secrets.parent, admin_token=None, metrics_token=None), OPERATORS_URL)
    after = _snapshot(operators_secrets)
    assert {name: after[name] for name in before} == before  # kept, not removed


def _start_many(data_dir: str, tag: str, rounds: int) -> list[str]:
    """``rounds`` runtimes' secrets written one after another, their values this process's own (a
    metrics token every other round, so files come and go); why any of them was refused."""
    refused = []
    for round_ in range(rounds):
        metrics = SecretStr(f"{tag}-metrics-token-{round_:04d}") if round_ % 2 else None
        try:
            worker_env(Settings(data_dir=Path(data_dir), admin_token=SecretStr(f"{tag}-admin-token-{round_:04d}"),
                                metrics_token=metrics), f"{EMBEDDED_URL}-{tag}")
        except Conflict as error:
            refused.append(str(error))
    return refused


def _assert_the_next_runtime_takes_every_file(data_dir: Path) -> None:
    """Every file of the secrets directory is Canopy's: a runtime of other values replaces or removes each."""
    worker_env(Settings(data_dir=data_dir, admin_token=SecretStr("next-admin-token-001"), metrics_token=None),
               EMBEDDED_URL + "-next")
    directory = data_dir / "secrets"
    assert (directory / "canopy_admin_token").read_text() == "next-admin-token-001"
    assert (directory / "canopy_database_url").read_text() == EMBEDDED_URL + "-next"
    assert not (directory / "canopy_metrics_token").exists()
    assert not [name for name in os.listdir(directory) if name.startswith(".canopy_")]  # nothing aside


def test_two_runtimes_starting_at_once_never_take_each_others_files_for_an_operators(tmp_path: Path) -> None:
    """Two runtimes starting on one data dir at once (two ``canopy run``s) each read, changed and
    wrote the record of Canopy's files unlocked: one's file written after the other read the record,
    or a record written over the other's, left a file of Canopy's looking like an operator's, and
    the next start was refused."""
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        refused = pool.starmap(_start_many, [(str(tmp_path), "first", 300), (str(tmp_path), "second", 300)])
    assert refused == [[], []], refused
    _assert_the_next_runtime_takes_every_file(tmp_path)


# A runtime writing its secrets, killed (SIGKILL) right after its Nth change to the directory: a file
# or the record replaced, or a file removed.
_KILLED_AFTER_STEP = """
import os, signal, sys
from pathlib import Path
from pydantic import SecretStr
from actors.runtime import worker_env
from persistence.settings import Settings

steps, kill_after = 0, int(sys.argv[2])

def step(change):
    def changed(*args, **kwargs):
        global steps
        change(*args, **kwargs)
        steps += 1
        if steps == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    return changed

os.replace, os.unlink = step(os.replace), step(os.unlink)
worker_env(Settings(data_dir=Path(sys.argv[1]), admin_token=SecretStr("crashed-admin-token-01"), metrics_token=None),
           sys.argv[3])
"""


def test_a_runtime_killed_at_any_step_of_writing_its_secrets_leaves_them_canopys(tmp_path: Path) -> None:
    """The files were written before the record that names them: a runtime killed in between left a
    file of Canopy's that the record did not name, taken for an operator's, and the next start was
    refused. Killed after each of its changes in turn (a replaced file, a removed one, the record),
    it leaves every file Canopy's: the next runtime replaces or removes each."""
    for kill_after in range(1, 20):
        data_dir = tmp_path / str(kill_after)
        worker_env(Settings(data_dir=data_dir, admin_token=SecretStr("earlier-admin-token-1"),
                            metrics_token=SecretStr("earlier-metrics-token")), EMBEDDED_URL)
        crashed = subprocess.run([sys.executable, "-c", _KILLED_AFTER_STEP, str(data_dir), str(kill_after),
                                  EMBEDDED_URL + "-crashed"], cwd=REPO, capture_output=True, text=True, timeout=120)
        if crashed.returncode == 0:  # it made fewer changes than that: every crash point was tried
            assert kill_after > 3, crashed  # a file replaced, one removed, one more replaced at least
            break
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        _assert_the_next_runtime_takes_every_file(data_dir)
    else:
        raise AssertionError("the runtime was killed at every step tried: it made more changes than expected")
