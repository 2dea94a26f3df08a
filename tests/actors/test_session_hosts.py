"""Shared session hosts (``CANOPY_SESSION_HOSTS``): sessions run as tasks named
``session:<id>`` inside a few long-lived host processes instead of one process each, the
tree supervisors run in the hosts too, and a killed host's Runs are recovered like a
killed session actor's.

The setting is read by every Ray process at start, so the scenario runs in a runtime and
Ray cluster of its own (a subprocess on the same database): see hosted_scenario.py.
"""

from __future__ import annotations

from pathlib import Path

from tests.actors.helpers import scenario_findings
from tests.conftest import RUNTIME_ENV


async def test_hosted_sessions_fan_out_and_survive_a_killed_host(database_url: str, tmp_path: Path) -> None:
    findings = await scenario_findings("tests.actors.hosted_scenario", {
        **RUNTIME_ENV, "CANOPY_SESSION_HOSTS": "2", "CANOPY_ACTOR_IDLE_SECONDS": "3",
        "CANOPY_DATABASE_URL": database_url, "CANOPY_DATA_DIR": str(tmp_path)}, timeout=480)

    fan = findings["fan_out"]
    assert (fan["status"], fan["output"]) == ("completed", "fan-out done")
    assert fan["session_actors"] == []  # no process per session...
    assert fan["hosts"] == ["canopy:sessions:0", "canopy:sessions:1"]  # ...two hosts for all of them
    assert fan["session_tasks_seen"] >= 1  # the dashboard shows the sessions as tasks named session:<id>
    assert fan["tree_actors"] == []  # the tree's supervisor ran in a host too...
    assert fan["peak_runs"] == 4  # ...and held the tree to its 4 slots (6 children, the root waiting)
    assert len(fan["hint_channels"]) == 1 and fan["hint_channels"][0] in fan["hosts"]  # hints over the socket

    idle = findings["idle"]  # idle sessions and supervisors leave their hosts; a new input brings them back
    assert idle == {"emptied": True, "status": "completed", "output": "back again"}

    kill = findings["kill"]
    assert (kill["status"], kill["output"]) == ("completed", "root got member done g done")
    assert (kill["grandchildren"], kill["messages"]) == (1, 1)  # side effects exactly once
    assert kill["recovered"] >= 1  # the killed host's Run was recovered by lease expiry
