"""PostgreSQL crashes and is started again while a tree works: the tree finishes with the same
result, every side effect once, and the API meanwhile answers 503 with Retry-After, soon
(database_restart_scenario.py, in a process and on a database server of its own). In the default
session shape: every process's pools reconnect by the same code wherever its sessions run, and what
a dedicated session's own process does once its connections died is test_recovery.py's
(test_an_idle_session_and_supervisor_passivate_after_their_database_connections_died)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.errors import RETRY_AFTER_SECONDS
from persistence.db import WAIT_SECONDS
from persistence.embedded import stop_embedded
from tests.actors.database_restart_scenario import MEMBERS, OUTAGE_SECONDS
from tests.actors.helpers import scenario_findings
from tests.conftest import DEFAULT_SHAPE, RUNTIME_ENV, SHAPES


@pytest.fixture
def short_data_dir() -> Iterator[Path]:
    """A data dir whose server socket fits in it: a restarted server then listens where the
    runtime's URL points (a long path's socket goes to a new /tmp directory at every start)."""
    path = Path(tempfile.mkdtemp(prefix="cdr-", dir="/tmp"))
    yield path
    stop_embedded(path)
    shutil.rmtree(path, ignore_errors=True)


async def test_a_tree_finishes_once_through_a_database_crash(short_data_dir: Path) -> None:
    findings = await scenario_findings("tests.actors.database_restart_scenario", {
        # Each API request waits 2 s for a connection (5 s by default): both fall inside the outage.
        **RUNTIME_ENV, **SHAPES[DEFAULT_SHAPE], "CANOPY_DATA_DIR": str(short_data_dir),
        "CANOPY_API_DB_WAIT_SECONDS": "2"},
        timeout=600)

    assert findings["down_seconds"] >= OUTAGE_SECONDS, findings
    members = range(MEMBERS)
    assert findings["result"] == ["completed", "root: " + " ".join(f"m{i} got g{i} done" for i in members)], findings
    # canopy run's watch said the database was unavailable, and went on to the result (it ended in a traceback).
    assert findings["cli"] == {"result": findings["result"], "said_unavailable": True}, findings
    # Each session created once, each message sent once, though Runs were cut mid-way.
    assert findings["paths"] == sorted(["/root", *(f"/root/m{i}" for i in members),
                                        *(f"/root/m{i}/g{i}" for i in members)]), findings
    assert findings["messages"] == [f"hello once from m{i}" for i in members], findings
    assert findings["open_inputs"] == [] and set(findings["turns"]) == {"completed"}, findings
    assert findings["peak_runs"] <= 4, findings
    # The API said to come back (not a 500), and then served.
    assert findings["api_before"]["status"] == findings["api_after"]["status"] == 200, findings
    assert len(findings["api_down"]) == 2, findings
    for answer in findings["api_down"]:
        assert answer["status"] == 503 and answer["retry_after"] == str(RETRY_AFTER_SECONDS), findings
        assert json.loads(answer["body"])["detail"].startswith("the database is unavailable"), findings
        # The replica's wait for a connection, not a Run's (30 s: each request waited that long).
        assert answer["seconds"] < WAIT_SECONDS, findings
