"""A tree on a Ray cluster of three nodes with ``session_spread = spread`` (actors/placement.py), in
both session shapes: its members run on several nodes, read from Ray's actor table; and a worker
node that runs some of them is removed mid-run, yet every Turn completes and no committed reply
happens twice. The cluster is ``ray.cluster_utils.Cluster`` in a process of its own: see
cluster_placement_scenario.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.actors.helpers import scenario_findings
from tests.conftest import RUNTIME_ENV, SHAPES

CHILDREN = [f"c{i}" for i in range(6)]


async def findings_of(case: str, shape: str, database_url: str, data_dir: Path) -> dict[str, Any]:
    return await scenario_findings("tests.actors.cluster_placement_scenario", {
        **RUNTIME_ENV, **SHAPES[shape], "CANOPY_LEASE_SECONDS": "5", "CANOPY_HEARTBEAT_SECONDS": "1",
        "CANOPY_SWEEP_SECONDS": "1", "CANOPY_DATA_DIR": str(data_dir), "SCENARIO_CASE": case,
        "SCENARIO_DATABASE_URL": database_url}, timeout=420)


def assert_every_turn_completed_once(findings: dict[str, Any]) -> None:
    assert findings["result"] == {"status": "completed", "output": "all done"}, findings
    assert sorted(findings["members"].values()) == sorted(["root", *CHILDREN])  # each create ran once
    assert findings["turns"] == ["completed"] * 7
    for child in CHILDREN:  # its tool step and its final reply, each committed once
        assert findings["replies"][child] == [f"{child} done"], findings
        assert findings["tool_replies"][child] == 1 and findings["tool_results"][child] == 1, findings
    assert findings["replies"]["root"] == ["all done"]
    assert findings["tool_results"]["root"] == len(CHILDREN) + 1  # the creates and the wait


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_spread_tree_runs_on_several_nodes(shape: str, database_url: str, tmp_path: Path) -> None:
    findings = await findings_of("spread", shape, database_url, tmp_path)
    print("DEBUG", findings)

    assert_every_turn_completed_once(findings)
    nodes = {*findings["workers"], findings["head"]}
    member_nodes = findings["member_nodes"]
    assert all(member_nodes.values()), findings  # every member's actor was seen in Ray's actor table...
    used = {node for seen in member_nodes.values() for node in seen}
    assert used <= nodes and len(used) >= 2, findings  # ...on two nodes or three


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_tree_survives_losing_a_node_mid_run(shape: str, database_url: str, tmp_path: Path) -> None:
    findings = await findings_of("node_lost", shape, database_url, tmp_path)
    print("DEBUG", findings)

    removed = findings["removed"]
    assert removed["node"] in findings["workers"] and removed["members"], findings  # it ran some of the children
    assert removed["node"] not in findings["gateway_nodes"]
    assert_every_turn_completed_once(findings)
    assert any(run.startswith("resume:") for run in findings["runs"]), findings  # the lost Runs were resumed
    # The members recovered from the lost node ran again elsewhere.
    for member in removed["members"]:
        assert set(findings["member_nodes"][member]) - {removed["node"]}, findings
