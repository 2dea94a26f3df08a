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


def test_serve_config_validates_against_serves_schema() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "serve.yaml").read_text()))
    assert config.http_options.host == "127.0.0.1"
    assert [app.import_path for app in config.applications] == ["api.serve_app:app"]


def test_kuberay_service_runs_the_same_serve_application() -> None:
    from ray.serve.schema import ServeDeploySchema

    manifest = yaml.safe_load((ROOT / "kuberay.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    in_cluster = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    local = ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "serve.yaml").read_text()))
    assert [app.model_dump() for app in in_cluster.applications] == [app.model_dump() for app in local.applications]
