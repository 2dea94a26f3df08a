"""The deployment files validate against the tools that consume them."""

from __future__ import annotations

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parent.parent


def test_cluster_yaml_validates_against_rays_schema() -> None:
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(config)  # raises on any schema violation
    prepared = prepare_config(config)
    assert prepared["provider"]["type"] == "local"
    assert any("--dashboard-host=127.0.0.1" in command for command in prepared["head_start_ray_commands"])
