"""One database for a Ray cluster: the embedded PostgreSQL listens on a Unix socket of one machine,
so on a cluster of several nodes Canopy refuses to start it and says what to set instead. The
cluster is ``ray.cluster_utils.Cluster`` with two nodes, in a process of its own:
see cluster_database_scenario.py."""

from __future__ import annotations

from pathlib import Path

from tests.actors.helpers import scenario_findings
from tests.conftest import RUNTIME_ENV


async def test_a_two_node_cluster_without_a_database_url_starts_no_postgres(database_url: str,
                                                                             tmp_path: Path) -> None:
    findings = await scenario_findings("tests.actors.cluster_database_scenario", {
        **RUNTIME_ENV, "CANOPY_DATA_DIR": str(tmp_path), "SCENARIO_DATABASE_URL": database_url}, timeout=420)

    refusals = [findings["join"], findings["connected_driver"], *findings["workers"].values()]
    for refused in refusals:
        assert refused["type"] == "SharedDatabaseRequired", findings
        assert "CANOPY_DATABASE_URL" in refused["message"]
        assert "Unix socket of one machine" in refused["message"]
    assert "has 2 nodes" in findings["join"]["message"]  # counted before joining...
    assert findings["joined_ray"] is False  # ...so the refused start never joined the cluster
    assert "has 2 nodes" in findings["workers"]["other_node"]["message"]
    assert findings["postgres"] == []  # no server of the scenario's data dir ever ran
    assert findings["pg_dir"] is False  # nor was one initialised
    assert findings["with_url"] == {"type": None, "gateway": True}  # the same cluster with a database URL
