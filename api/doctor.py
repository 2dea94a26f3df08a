"""``canopy doctor``: what ``canopy up`` needs, checked one by one with the same settings; each
line ``OK`` with what was found, or ``FAIL`` with what to do. Exit code 0 only when none failed.

Checks, in order: the database answers; its schema version against this Canopy's (a missing
or older schema is fine: ``canopy up`` creates or migrates it); Ray starts (or the cluster of
``CANOPY_RAY_ADDRESS`` accepts a driver) and runs a task, and where its token is; the Docker
engine answers; the sandbox image is there; the sandboxes' memory limits, all of them together,
against the engine's memory; a workdir's disk quota can be made (a probe workdir mounted and
unmounted under the data dir's projects); the default model (its route and key, without a
request). A check that needs a failed one is ``SKIP``ped rather than failed twice; what the
doctor cannot verify, or a risk that is the operator's to take, is a ``NOTE``. Whatever the
doctor starts (the embedded PostgreSQL when it was not running, a local Ray) it stops again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors

from actors.runtime import private_ray_token
from api.up import ray_token_location
from persistence.db import resolve_database_url
from persistence.embedded import embedded_url, pgdata, require_one_node, running_postmaster, stop_embedded
from persistence.errors import CanopyError
from persistence.migrations import connect, current_version, latest_version, server_version
from persistence.settings import WORKDIR_MIN_MB, Settings, get_settings
from sandbox import workdirs
from sandbox.base import OOM_SCORE_ADJ
from sandbox.images import build_hint

SCRIPTED_MODEL = "canopy/scripted"


class Problem(Exception):
    """A check failed; the sentence says what is wrong and what to do."""


class Skipped(Exception):
    """A check that needs an earlier one that failed."""


class Unverified(Exception):
    """A check the doctor cannot make; the sentence says how to find out."""


@dataclasses.dataclass
class Outcome:
    name: str
    status: str  # OK, FAIL, SKIP (an earlier check failed) or NOTE (not verifiable here)
    detail: str


def _ping() -> int:
    return os.getpid()


def _size(count: int) -> str:
    """Bytes as whole GiB or MiB where they are whole, else GiB to a tenth."""
    for unit, name in ((2**30, "GiB"), (2**20, "MiB")):
        if count % unit == 0:
            return f"{count // unit} {name}"
    return f"{count / 2**30:.1f} GiB"


class Doctor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.database_url: str | None = None
        self.started_pg = False
        self.docker: docker.DockerClient | None = None

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        return [("database", self.database), ("schema", self.schema), ("Ray", self.ray),
                ("Docker", self.docker_engine), ("sandbox image", self.sandbox_image),
                ("sandbox memory", self.sandbox_memory), ("workdir disk", self.workdir_disk), ("model", self.model)]

    def run(self) -> list[Outcome]:
        outcomes = []
        try:
            for name, check in self.checks():
                try:
                    outcome = Outcome(name, "OK", check())
                except Skipped as skipped:
                    outcome = Outcome(name, "SKIP", str(skipped))
                except Unverified as unverified:
                    outcome = Outcome(name, "NOTE", str(unverified))
                except (Problem, CanopyError) as problem:
                    outcome = Outcome(name, "FAIL", str(problem))
                print(f"{outcome.status:<5} {outcome.name:<14} {outcome.detail}", flush=True)
                outcomes.append(outcome)
        finally:
            self.close()
        return outcomes

    def close(self) -> None:
        if self.started_pg:
            stop_embedded(self.settings.data_dir)
        if self.docker is not None:
            self.docker.close()

    # -- the checks: each returns what it found, or raises Problem / Skipped ------------------------------

    def database(self) -> str:
        if self.settings.database_url is not None:
            where = "CANOPY_DATABASE_URL"
            url = resolve_database_url(self.settings)
        else:
            where, url = self._embedded()
        with connect(url) as conn:  # DatabaseUnreachable says what to do
            version = server_version(conn)
        self.database_url = url
        return f"{where} answers: PostgreSQL {version}"

    def _embedded(self) -> tuple[str, str]:
        require_one_node(self.settings.ray_address)  # as canopy up: a cluster needs a shared database
        path = pgdata(self.settings.data_dir)
        running = running_postmaster(self.settings.data_dir)
        try:
            url = embedded_url(self.settings.data_dir)
        except Exception as error:  # pgserver reports a server that does not start with errors of its own
            raise Problem(f"the embedded PostgreSQL under {path} does not start: {error}; see {path / 'log'}") \
                from error
        self.started_pg = running is None
        state = f"running, pid {running}" if running else "started for this check, then stopped"
        return f"the embedded PostgreSQL under {path} ({state})", url

    def schema(self) -> str:
        if self.database_url is None:
            raise Skipped("needs the database")
        with connect(self.database_url) as conn:
            version = current_version(conn)
        latest = latest_version()
        if version is None:
            return f"none yet: canopy up creates it (version {latest})"
        if version > latest:
            raise Problem(f"version {version} is newer than this Canopy's ({latest}): upgrade Canopy")
        if version < latest:
            return f"version {version}: canopy up migrates it to {latest}"
        return f"version {version}, the latest"

    def ray(self) -> str:
        import ray

        began = time.monotonic()
        address = self.settings.ray_address
        readable: str | None = None
        try:
            if address is not None:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                # As canopy up's Ray: a token this Ray writes is not every local user's. One others could
                # read is reported, not replaced: a diagnosis must not cut a running cluster's clients off.
                readable = private_ray_token(replace_readable=False)
                ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.WARNING,
                         log_to_driver=False)
            ray.get(ray.remote(num_cpus=0)(_ping).remote(), timeout=120)
        except Exception as error:
            hint = ("check CANOPY_RAY_ADDRESS, and that this machine has the cluster's token (RAY_AUTH_TOKEN, "
                    "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)" if address is not None
                    else "see the Ray logs under /tmp/ray/session_latest/logs")
            what = "a local Ray" if address is None else f"joining {address}"
            raise Problem(f"{what} failed: {error}; {hint}") from error
        finally:
            ray.shutdown()
        found = ("a local Ray starts" if address is None else f"joined {address}") + \
            f" and runs a task (Ray {ray.__version__}, {time.monotonic() - began:.1f} s)"
        if address is not None:
            return found
        token = ray_token_location()
        if token is None:
            return f"{found}; token authentication is off (RAY_AUTH_MODE), keep Ray on loopback"
        if token != "RAY_AUTH_TOKEN" and not os.path.exists(token):
            raise Problem(f"{found}, but its token file {token} is missing: `ray get-auth-token --generate` makes one")
        warning = f"; WARNING: {readable}" if readable else ""
        return f"{found}; token in {token} (`ray get-auth-token` prints it){warning}"

    def docker_engine(self) -> str:
        if self.settings.sandbox_backend == "local":
            return "not used: CANOPY_SANDBOX_BACKEND=local runs model commands on this host, NOT isolated"
        from sandbox.docker_backend import connect as connect_docker

        client = connect_docker(max_pool_size=2)  # SandboxUnavailable says what to do
        self.docker = client
        version = client.version()
        return f"engine {version.get('Version', '?')} answers (API {version.get('ApiVersion', '?')})"

    def sandbox_image(self) -> str:
        image = self.settings.sandbox_image
        if self.settings.sandbox_backend == "local":
            return "not used (CANOPY_SANDBOX_BACKEND=local)"
        if self.docker is None:
            raise Skipped("needs the Docker engine")
        try:
            found = self.docker.images.get(image)
        except docker.errors.ImageNotFound:
            raise Problem(f"{image} (CANOPY_SANDBOX_IMAGE) is not on the engine: {build_hint(image)}") from None
        return f"{image} present ({found.attrs.get('Size', 0) / 1e6:.0f} MB)"

    def sandbox_memory(self) -> str:
        if self.settings.sandbox_backend == "local":
            return "not limited (CANOPY_SANDBOX_BACKEND=local)"
        if self.docker is None:
            raise Skipped("needs the Docker engine")
        count, each = self.settings.sandbox_max_containers, self.settings.sandbox_memory_bytes
        try:
            memory = int(self.docker.info()["MemTotal"])
        except (docker.errors.DockerException, KeyError, TypeError, ValueError) as error:
            raise Unverified(f"the engine does not say its memory ({error!r}): check that {count} sandboxes of "
                             f"{_size(each)} fit in the node's") from None
        sandboxes = f"{count} sandboxes of {_size(each)}"
        named = "(CANOPY_SANDBOX_MAX_CONTAINERS × CANOPY_SANDBOX_MEMORY)"
        engine = f"the engine's {memory / 2**30:.1f} GiB"
        if count * each <= memory:
            return f"{sandboxes} fit in {engine} {named}"
        # Limits are ceilings, and often overcommitted on purpose: a risk to know, not a failure.
        raise Unverified(f"{sandboxes} {named} may take {_size(count * each)}, more than {engine}: when the "
                         f"node runs out of memory the kernel kills a sandbox's processes first (their OOM score "
                         f"adjustment is {OOM_SCORE_ADJ}); lower either setting to keep them within it")

    def workdir_disk(self) -> str:
        size, projects = self.settings.sandbox_workdir_mb, self.settings.data_dir / "projects"
        if size == 0:
            raise Unverified(f"no quota (CANOPY_SANDBOX_WORKDIR_MB=0): a model's command can fill the file system "
                             f"of {projects}; give it one of its own")
        projects.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=projects, prefix=".doctor-") as probe:
            workdir = Path(probe) / "workdir"
            workdirs.prepare(workdir, WORKDIR_MIN_MB)  # a SandboxError says what to set
            workdirs.unmount(workdir)
        return f"{size} MiB per project workdir (CANOPY_SANDBOX_WORKDIR_MB): a loop-mounted image works here"

    def model(self) -> str:
        model = self.settings.default_model
        if model == SCRIPTED_MODEL:
            return f"{model} (CANOPY_DEFAULT_MODEL): built in, needs no network and no key"
        # The runtime's gateway would say the same: this one reads the same models file, secrets
        # directory and provider variables. It makes no request (a key's validity is the provider's).
        from actors.gateways import gateway_here  # litellm: only this check pays for it

        if problem := asyncio.run(gateway_here(self.settings).check_model(model)):
            raise Problem(f"{model} (CANOPY_DEFAULT_MODEL): {problem}")
        return f"{model} (CANOPY_DEFAULT_MODEL): litellm has its key and endpoint (not called)"

def main() -> int:
    outcomes = Doctor(get_settings()).run()
    failed = [outcome.name for outcome in outcomes if outcome.status in ("FAIL", "SKIP")]
    print("all OK" if not failed else f"not OK: {', '.join(failed)}", flush=True)
    return 0 if not failed else 1
