"""Every use of Ray's private APIs, in one place.

Checked against Ray 2.60.0 (pyproject.toml pins ``ray>=2.60,<2.61``); a new Ray version must
be checked here first (tests/actors/test_runtime.py checks the preload,
tests/hostile/test_api_exposure.py checks the Serve rebinding):

- ``system_config_options``: ``ray.init``'s private ``_system_config`` with ``preload_python_modules``,
  so every worker process a Ray started by Canopy spawns imports Canopy's actor modules before
  an actor is placed on it, and ``worker_oom_score_adjustment`` (actors/runtime.py;
  tests/actors/test_runtime.py checks both).
- ``rewrite_replica_grpc_address``: Serve starts each replica's inter-deployment gRPC
  server through ``ray.serve._private.replica.add_port_to_grpc_server`` with ``[::]:0``,
  and has no option for the address (api/serve_app.py).
- ``prestart_worker``: the raylet's ``PrestartWorkers`` RPC (``ray.core.generated``'s
  node manager stubs, over ``ray._private.grpc_utils.init_grpc_channel``, which adds Ray's
  token authentication), reached at ``ray._private.worker.global_worker.node``'s address. Ray
  2.60 has no Python API for it (later Rays call it through ``CoreWorker.prestart_workers``);
  tests/actors/test_runtime.py checks that a dedicated actor starts in a prestarted worker.
  Only a node's session directory calls it (actors/directory.py): the stubs weigh ~14 MiB,
  which no session process needs to carry.
- ``alive_actors``: ``ray._private.state``'s actor table (Ray's GCS): the only other way to tell
  an actor alive from one still starting is the dashboard's state API, which a cluster may run
  without (the sweeper's check of per-node actors that answer nothing, actors/sweeper.py;
  tests/actors/test_sandbox_hosts.py checks it).
- ``serve_http_address``: ``ray.serve.context._get_global_client`` and its client's
  ``http_config``: Serve has no public way to ask whether it runs on a cluster, nor where its
  proxies listen, and ``serve.start`` on a running Serve ignores new HTTP options with only a
  warning (api/up.py; tests/api/test_api_canopy_up.py checks it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import ray


def system_config_options(preload: Sequence[str], worker_oom_score_adj: int) -> dict[str, Any]:
    """``ray.init`` options that make every worker process import ``preload`` as it starts and
    carry ``worker_oom_score_adj`` (Ray's own default: 1000)."""
    return {"_system_config": {"preload_python_modules": list(preload),
                               "worker_oom_score_adjustment": worker_oom_score_adj}}


def rewrite_replica_grpc_address(rewrite: Callable[[str], str]) -> None:
    """From now on, in this process, Serve binds a replica's gRPC server to ``rewrite(address)``."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server

    def bind_rewritten(server: Any, address: str) -> int:
        return int(bind(server, rewrite(address)))

    replica.add_port_to_grpc_server = bind_rewritten


@functools.cache
def _node_manager(address: str) -> Any:
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import node_manager_pb2_grpc

    return node_manager_pb2_grpc.NodeManagerServiceStub(init_grpc_channel(address))


def prestart_worker(job_id: str, runtime_env: str, keep_alive_seconds: float) -> None:
    """Ask this node's raylet to start one idle worker process for ``job_id`` (hex) and
    ``runtime_env`` (serialized, as ``get_runtime_env_string`` gives it): the next actor of that
    job and runtime env placed on this node starts in it at once. Unused, it exits after
    ``keep_alive_seconds``. Blocks for the RPC (call it from a thread)."""
    from ray._private.worker import global_worker
    from ray.core.generated import common_pb2, node_manager_pb2, runtime_environment_pb2

    node = global_worker.node
    request = node_manager_pb2.PrestartWorkersRequest(
        language=common_pb2.PYTHON, job_id=ray.JobID.from_hex(job_id).binary(),
        runtime_env_info=runtime_environment_pb2.RuntimeEnvInfo(serialized_runtime_env=runtime_env),
        keep_alive_duration_secs=max(1, round(keep_alive_seconds)), num_workers=1)
    _node_manager(f"{node.node_ip_address}:{node.node_manager_port}").PrestartWorkers(request, timeout=10)


def alive_actors() -> dict[str, tuple[str, int]]:
    """The named actors that are alive (started, not restarting), by name: their actor id and how
    often Ray has restarted them. Blocks for the GCS (call it from a thread)."""
    from ray._private.state import state

    table = state.actor_table(None, actor_state_name="ALIVE")
    return {str(info["Name"]): (str(actor_id), int(info["NumRestarts"])) for actor_id, info in table.items()
            if info["Name"]}


def serve_http_address() -> tuple[str, int] | None:
    """Where the HTTP proxies of the Serve running on the connected cluster listen (host, port);
    None when Serve does not run there."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return None if client is None else (str(client.http_config.host), int(client.http_config.port))
