"""The deployment files validate against the tools that consume them, and deploy.

cluster.yaml against Ray's cluster launcher schema, serve.yaml against Serve's, kuberay.yaml against
the RayService CRD's OpenAPI schema of KubeRay v1.7.0 (tests/data, its source commit inside) with
kubectl's strict field validation (an unknown field is an error), plus what KubeRay and Canopy need
beyond the schema. Each check is shown to fail on a broken copy. Building the image and running
cluster.yaml's setup commands take minutes: they run with CANOPY_TEST_IMAGE_BUILD=1.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from actors.runtime import MALLOC_ARENA_MAX, RAY_WORKER_OOM_SCORE_ADJ, WORKER_PRELOAD_MODULES

ROOT = Path(__file__).resolve().parent.parent
CRD_SCHEMA = ROOT / "tests" / "data" / "kuberay-v1.7.0-rayservice-schema.json"
# The ports KubeRay looks up by name on the head container (its utils/constant.go).
KUBERAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "serve": 8000}
SECRETS_SECRET = "canopy-secrets"
Manifest = dict[str, Any]


def load_yaml(name: str) -> Any:
    return yaml.safe_load((ROOT / name).read_text())


def dockerfile_image() -> str:
    """The tag the Dockerfile's documented build commands give the image."""
    tags = set(re.findall(r"docker build .*-t (\S+) \.$", (ROOT / "Dockerfile").read_text(), re.MULTILINE))
    assert len(tags) == 1, tags
    return tags.pop()


def dockerfile_env(name: str) -> str:
    found = re.search(rf"^\s*(?:ENV\s+)?{name}=(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert found, name
    return found.group(1)


# -- cluster.yaml ---------------------------------------------------------------------------------------


def cluster_config() -> dict[str, Any]:
    config = load_yaml("cluster.yaml")
    validate_config(config)  # raises on any schema violation
    return prepare_config(config)


def home(path: str) -> str:
    """A node path as the remote shell sees it (``~`` and ``$HOME`` alike)."""
    return re.sub(r"^(~|\$HOME)(?=/)", "$HOME", path)


def test_cluster_yaml_validates_and_installs_from_what_it_mounts() -> None:
    config = cluster_config()
    assert config["provider"]["type"] == "local"
    mounts = {home(remote): local for remote, local in config["file_mounts"].items()}
    assert mounts == {"$HOME/canopy/dist": "./dist", "$HOME/canopy/serve.yaml": "./serve.yaml",
                      "$HOME/.canopy/secrets": "~/.canopy/cluster-secrets",
                      "$HOME/.ray/auth_token": "~/.ray/auth_token"}
    assert (ROOT / "serve.yaml").is_file()
    commands = [*config["setup_commands"], *config["head_setup_commands"], *config["worker_setup_commands"],
                *config["head_start_ray_commands"], *config["worker_start_ray_commands"]]
    installs = [command for command in commands if " install " in command]
    assert installs, commands
    for command in installs:  # only from the mounted wheelhouse: no index, no git, no source tree
        assert "--no-index" in command and "~/canopy/dist" in command, command
    assert not any("git+" in command for command in commands)
    # The database URL and tokens never ride on a command line or an environment variable.
    assert not any(re.search(r"CANOPY_(DATABASE_URL|ADMIN_TOKEN|METRICS_TOKEN)|RAY_AUTH_TOKEN=", c) for c in commands)
    starts = [c for c in commands if "ray start" in c]
    assert len(starts) == 2
    for command in starts:  # the secrets directory is the mounted one, Ray's token is required
        assert "RAY_AUTH_MODE=token" in command and "CANOPY_SECRETS_DIR=$HOME/.canopy/secrets" in command, command
        # Ray's processes and workers inherit it from `ray start`, as they do from `canopy up`.
        assert f"MALLOC_ARENA_MAX={MALLOC_ARENA_MAX} " in command, command
    head = config["head_start_ray_commands"]
    assert "--dashboard-host=127.0.0.1" in head[1]
    assert head[2] == "RAY_AUTH_MODE=token ~/canopy-venv/bin/serve deploy ~/canopy/serve.yaml"  # after Ray starts


@pytest.mark.parametrize("has_url", [False, True])
def test_cluster_setup_stops_without_a_database_url(tmp_path: Path, has_url: bool) -> None:
    """The first setup command on a node whose mounted secrets hold no database URL fails and says why."""
    secrets = tmp_path / ".canopy" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "canopy_admin_token").write_text("adm_x")
    if has_url:
        (secrets / "canopy_database_url").write_text("postgresql://canopy@db.internal/canopy")
    check = cluster_config()["setup_commands"][0]
    done = subprocess.run(["bash", "-c", check], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=30)
    if has_url:
        assert (done.returncode, done.stderr) == (0, "")
    else:
        assert done.returncode == 1
        assert "canopy_database_url is missing: a cluster needs one PostgreSQL that every node reaches" in done.stderr


# -- serve.yaml -----------------------------------------------------------------------------------------


def test_serve_config_validates_against_serves_schema() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(load_yaml("serve.yaml"))
    assert config.http_options.host == "127.0.0.1"
    assert [app.import_path for app in config.applications] == ["api.serve_app:app"]
    assert not any(app.runtime_env.get("env_vars", {}).keys() & {"CANOPY_DATABASE_URL", "CANOPY_ADMIN_TOKEN"}
                   for app in config.applications)


# -- kuberay.yaml ---------------------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """The CRD schema as `kubectl apply` checks it (strict field validation): an object with declared
    properties takes no others, unless it keeps unknown fields on purpose."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        closed["additionalProperties"] = False
    return closed


def schema_errors(manifest: Manifest) -> list[str]:
    """What the RayService CRD's OpenAPI schema (v1.7.0) refuses in ``manifest``. Its CEL rules
    (x-kubernetes-validations) are not evaluated."""
    schema = strict(json.loads(CRD_SCHEMA.read_text())["openAPIV3Schema"])
    validator = jsonschema.Draft202012Validator(schema)
    found = [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(manifest)]
    if (manifest.get("apiVersion"), manifest.get("kind")) != ("ray.io/v1", "RayService"):
        found.append("not a ray.io/v1 RayService")
    return found


def ray_containers(manifest: Manifest) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    cluster = manifest["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]]
    pods += [group["template"]["spec"] for group in cluster.get("workerGroupSpecs", [])]
    return [(pod, pod["containers"][0]) for pod in pods]


def secrets_problems(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    name = container["name"]
    env = {item["name"]: item for item in container.get("env", [])}
    secrets_dir = env.get("CANOPY_SECRETS_DIR", {}).get("value")
    found = []
    if secrets_dir != f"{dockerfile_env('CANOPY_DATA_DIR')}/secrets":
        found.append(f"{name}: CANOPY_SECRETS_DIR is not <data dir>/secrets")
    volumes = {v["name"] for v in pod.get("volumes", []) if v.get("secret", {}).get("secretName") == SECRETS_SECRET}
    if not any(m["name"] in volumes and m["mountPath"] == secrets_dir for m in container.get("volumeMounts", [])):
        found.append(f"{name}: the Secret {SECRETS_SECRET} is not mounted at CANOPY_SECRETS_DIR")
    found += [f"{name}: {key} comes from the environment" for key, item in env.items()
              if "valueFrom" in item or re.search(r"DATABASE_URL|TOKEN|_KEY$", key)]
    return found


def kuberay_problems(manifest: Manifest) -> list[str]:
    """The schema's errors, then what KubeRay and Canopy need beyond it."""
    found = schema_errors(manifest)
    if found:
        return found
    cluster = manifest["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    if cluster["rayVersion"] != ray.__version__:
        found.append(f"rayVersion {cluster['rayVersion']} is not the installed Ray {ray.__version__}")
    if cluster.get("authOptions", {}).get("mode") != "token" or not cluster["authOptions"].get("secretName"):
        found.append("Ray's token authentication is off or has no Secret")
    if head["rayStartParams"].get("dashboard-host") != "0.0.0.0":
        found.append("the dashboard is unreachable from outside the head pod")
    ports = head["template"]["spec"]["containers"][0].get("ports", [])
    found += [f"head port {port['containerPort']} has no name" for port in ports if not port.get("name")]
    named = {port["name"]: port["containerPort"] for port in ports if port.get("name")}
    found += [f"head port {name} ({number}) is missing" for name, number in KUBERAY_PORTS.items()
              if named.get(name) != number]
    if cluster.get("enableInTreeAutoscaling") is not True:
        found.append("enableInTreeAutoscaling is off: KubeRay ignores minReplicas/maxReplicas")
    for group in cluster.get("workerGroupSpecs", []):
        if not group.get("minReplicas", 0) <= group.get("replicas", 0) <= group.get("maxReplicas", 0):
            found.append(f"worker group {group['groupName']}: replicas outside [minReplicas, maxReplicas]")
    for pod, container in ray_containers(manifest):
        if container["image"] != dockerfile_image():
            found.append(f"{container['name']}: image {container['image']} is not the Dockerfile's")
        resources = container.get("resources", {})
        found += [f"{container['name']}: no {kind} {what}" for kind in ("requests", "limits")
                  for what in ("cpu", "memory") if what not in resources.get(kind, {})]
        found += secrets_problems(pod, container)
    return found


def test_kuberay_manifest_validates_against_the_crd_schema() -> None:
    assert kuberay_problems(load_yaml("kuberay.yaml")) == []


def test_the_image_runs_ray_with_canopys_malloc_arenas() -> None:
    # Every Ray process of a KubeRay pod inherits the image's environment, as `canopy up`'s do its own.
    assert dockerfile_env("MALLOC_ARENA_MAX") == MALLOC_ARENA_MAX


def test_every_deploy_file_preloads_what_the_runtime_preloads() -> None:
    # The head's system config reaches every node (a worker's `ray start` takes none): kuberay.yaml
    # preloaded modules the runtime had stopped preloading, and no test compared them.
    found = re.search(r"--system-config='(\{.*?\})'", (ROOT / "cluster.yaml").read_text())
    assert found is not None
    head = load_yaml("kuberay.yaml")["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    for config in (found.group(1), head["system-config"].strip().strip("'")):
        assert json.loads(config) == {"preload_python_modules": list(WORKER_PRELOAD_MODULES),
                                      "worker_oom_score_adjustment": RAY_WORKER_OOM_SCORE_ADJ}


def _head_ports(m: Manifest) -> list[dict[str, Any]]:
    return m["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]


def _workers(m: Manifest) -> dict[str, Any]:
    return m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]


def _set(path: str, value: Any) -> Callable[[Manifest], None]:
    def change(m: Manifest) -> None:
        *parents, last = path.split(".")
        node = m
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return change


def _rename_min_replicas(m: Manifest) -> None:
    _workers(m)["minReplica"] = _workers(m).pop("minReplicas")


def _unname_dashboard(m: Manifest) -> None:
    next(port for port in _head_ports(m) if port["containerPort"] == 8265).pop("name")


def _url_from_env(m: Manifest) -> None:
    _workers(m)["template"]["spec"]["containers"][0]["env"].append(
        {"name": "CANOPY_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": SECRETS_SECRET, "key": "url"}}})


# Each broken copy: what breaks it, and what the check says (schema: the CRD schema refuses it).
BROKEN: dict[str, tuple[Callable[[Manifest], None], str]] = {
    "unknown field": (_rename_min_replicas, "schema: 'minReplica' was unexpected"),
    "wrong type": (_set("spec.rayClusterConfig.workerGroupSpecs.0.replicas", "two"), "schema: 'two' is not of type"),
    "unknown auth mode": (_set("spec.rayClusterConfig.authOptions.mode", "password"), "schema: 'password' is not one"),
    "port without a name": (_unname_dashboard, "head port 8265 has no name"),
    "dashboard on loopback": (_set("spec.rayClusterConfig.headGroupSpec.rayStartParams.dashboard-host",
                                   "127.0.0.1"), "dashboard is unreachable"),
    "no autoscaling": (_set("spec.rayClusterConfig.enableInTreeAutoscaling", False), "enableInTreeAutoscaling is off"),
    "auth off": (_set("spec.rayClusterConfig.authOptions.mode", "disabled"), "token authentication is off"),
    "database URL in the environment": (_url_from_env, "CANOPY_DATABASE_URL comes from the environment"),
    "another image": (_set("spec.rayClusterConfig.headGroupSpec.template.spec.containers.0.image",
                           "rayproject/ray:2.60.0"), "is not the Dockerfile's"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_kuberay_manifest_fails(case: str) -> None:
    change, expected = BROKEN[case]
    broken = copy.deepcopy(load_yaml("kuberay.yaml"))
    change(broken)
    in_schema = expected.startswith("schema: ")
    found = schema_errors(broken) if in_schema else kuberay_problems(broken)
    assert any(expected.removeprefix("schema: ") in problem for problem in found), found


def test_kuberay_service_runs_the_same_serve_application() -> None:
    from ray.serve.schema import ServeDeploySchema

    manifest = load_yaml("kuberay.yaml")
    in_cluster = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    local = ServeDeploySchema.model_validate(load_yaml("serve.yaml"))
    assert [app.model_dump() for app in in_cluster.applications] == [app.model_dump() for app in local.applications]


# -- the image and cluster.yaml's setup, built for real (minutes: CANOPY_TEST_IMAGE_BUILD=1) -----------

needs_build = pytest.mark.skipif(os.environ.get("CANOPY_TEST_IMAGE_BUILD") != "1",
                                 reason="builds a wheelhouse and a Docker image (minutes): CANOPY_TEST_IMAGE_BUILD=1")


def run(*args: str | Path, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(arg) for arg in args], capture_output=True, text=True, timeout=timeout, **options)
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --wheel-dir dist .``, as the README says, into a directory of its own."""
    dist = tmp_path_factory.mktemp("context") / "dist"
    run(sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", dist, ROOT, timeout=900)
    return dist


@pytest.fixture
def image(wheelhouse: Path) -> Iterator[str]:
    """The image built offline (no network at all) on the Debian base; removed afterwards."""
    run("bash", ROOT / ".ci" / "canopy-base.sh", "canopy-base:bookworm", timeout=1200)
    context = wheelhouse.parent
    for name in ("Dockerfile", ".dockerignore"):
        shutil.copy(ROOT / name, context / name)
    tag = f"canopy:test-{uuid.uuid4().hex[:8]}"
    before = set(install_stage_images())
    started = time.monotonic()
    run("docker", "build", "-q", "--network", "none", "--build-arg", "BASE=canopy-base:bookworm", "-t", tag, context,
        timeout=1800)
    size = int(run("docker", "image", "inspect", "-f", "{{.Size}}", tag, timeout=60).stdout)
    print(f"docker build: {time.monotonic() - started:.0f} s, image {size / 1e6:.0f} MB")
    yield tag
    # The image and the untagged images of its install stage (a gigabyte and more on vfs).
    subprocess.run(["docker", "image", "rm", tag, *(set(install_stage_images()) - before)], capture_output=True,
                   timeout=300)


def install_stage_images() -> list[str]:
    return run("docker", "images", "-q", "--filter", "dangling=true", "--filter", "label=canopy.stage=install",
               timeout=60).stdout.split()


@needs_build
@pytest.mark.timeout(3600)
def test_the_image_builds_offline_and_serves_the_api(image: str) -> None:
    config = json.loads(run("docker", "image", "inspect", "-f", "{{json .Config}}", image, timeout=60).stdout)
    assert config["User"] == "ray"
    assert f"MALLOC_ARENA_MAX={MALLOC_ARENA_MAX}" in config["Env"]
    assert not [e for e in config["Env"] if re.match(r"(CANOPY_(DATABASE_URL|ADMIN_TOKEN|METRICS_TOKEN)|\w+_KEY)=", e)]
    container = run("docker", "run", "-d", "--network", "none", image, "canopy", "up", timeout=120).stdout.strip()
    try:
        deadline = time.monotonic() + 600
        while "Canopy is up" not in (logs := run("docker", "logs", container, timeout=60)).stdout:
            running = run("docker", "inspect", "-f", "{{.State.Running}}", container, timeout=60).stdout.strip()
            assert running == "true" and time.monotonic() < deadline, logs.stdout[-3000:] + logs.stderr[-3000:]
            time.sleep(2)
        health = run("docker", "exec", container, "wget", "-q", "-O-", "http://127.0.0.1:8000/api/v1/healthz",
                     timeout=60).stdout
        assert json.loads(health) == {"status": "ok", "database": "ok", "ray": "ok"}
        # Built from the wheel alone: Canopy's packages are installed, its tests and sources are not.
        listing = run("docker", "exec", container, "sh", "-c",
                      "ls /opt/canopy/lib/python3.11/site-packages; ls -a /home/ray", timeout=60).stdout.split()
        assert {"actors", "api", "persistence", "sandbox"} <= set(listing)
        assert not {"tests", "pyproject.toml", ".git", ".venv"} & set(listing)
        # Its processes import bytecode: the user ray could not write it, and compiling Ray, litellm
        # and Canopy at each process start costs seconds of CPU.
        cached = run("docker", "exec", container, "python3", "-c",
                     "import os, actors.hosting, litellm, ray; "
                     "print(*(os.path.exists(m.__cached__) for m in (actors.hosting, litellm, ray)))",
                     timeout=120).stdout.split()
        assert cached == ["True", "True", "True"]
        # The data dir a secrets volume is mounted into belongs to the user Canopy runs as.
        owner = run("docker", "exec", container, "stat", "-c", "%U %a", "/home/ray/.canopy", timeout=60).stdout
        assert owner.split() == ["ray", "700"]
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=120)


@needs_build
@pytest.mark.timeout(3600)
def test_cluster_setup_commands_install_canopy_from_the_mounts(wheelhouse: Path, tmp_path: Path) -> None:
    """cluster.yaml's setup commands, on a node whose home holds what its file_mounts copy."""
    config = cluster_config()
    node = tmp_path / "node"
    (node / "canopy").mkdir(parents=True)
    shutil.copytree(wheelhouse, node / "canopy" / "dist")
    shutil.copy(ROOT / "serve.yaml", node / "canopy" / "serve.yaml")
    (node / ".canopy" / "secrets").mkdir(parents=True)
    (node / ".canopy" / "secrets" / "canopy_database_url").write_text("postgresql://canopy@db.internal/canopy")
    (node / ".ray").mkdir()
    (node / ".ray" / "auth_token").write_text("t" * 32)
    env = {"HOME": str(node), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PIP_NO_INDEX": "1"}
    for command in config["setup_commands"]:
        run("bash", "-c", command, env=env, timeout=1200)
    venv = node / "canopy-venv" / "bin"
    assert (venv / "ray").exists() and (venv / "serve").exists()
    shown = run(venv / "python", "-m", "pip", "show", "canopy", timeout=60, env=env).stdout
    assert "Version: 0.1.0" in shown
    assert oct((node / ".canopy" / "secrets" / "canopy_database_url").stat().st_mode & 0o777) == "0o600"
    # The installed Canopy finds the mounted URL through CANOPY_SECRETS_DIR, as `ray start` gives it.
    url = run(venv / "python", "-c", "from persistence.settings import Settings, reveal; "
              "print(reveal(Settings().database_url))", timeout=120, cwd=tmp_path,
              env={**env, "CANOPY_SECRETS_DIR": str(node / ".canopy" / "secrets")}).stdout.strip()
    assert url == "postgresql://canopy@db.internal/canopy"


def test_the_serve_application_sets_no_canopy_setting() -> None:
    """Ray hands an application's runtime_env down to every actor its replicas make (the sweeper, the
    session hosts, under Serve alone): a setting meant for the replica there sizes them too (a
    replica's pool of 16 made each host's 32). The replica's own settings are CANOPY_API_*."""
    local = load_yaml("serve.yaml")["applications"][0]["runtime_env"]["env_vars"]
    in_cluster = yaml.safe_load(load_yaml("kuberay.yaml")["spec"]["serveConfigV2"])["applications"][0]
    assert [name for name in [*local, *in_cluster["runtime_env"]["env_vars"]] if name.startswith("CANOPY_")] == []
