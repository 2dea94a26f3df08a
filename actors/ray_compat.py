"""Every use of Ray's private APIs, in one place.

Checked against Ray 2.60.0 (pyproject.toml pins ``ray>=2.60,<2.61``); a new Ray version must
be checked here first (tests/actors/test_ray_compat.py asks a raylet for workers,
tests/hostile/test_api_exposure.py checks the Serve rebinding):

- ``RayletWorkers``: the raylet's ``PrestartWorkers`` RPC (``ray.core.generated`` protobufs, a
  channel from ``ray._private.grpc_utils``, the runtime env as ``ray._private.utils``
  serialises it for the raylet). Ray has no public way to ask for idle worker processes
  ahead of demand; the session directory's warm pool uses it (actors/directory.py).
- ``rewrite_replica_grpc_address``: Serve starts each replica's inter-deployment gRPC
  server through ``ray.serve._private.replica.add_port_to_grpc_server`` with ``[::]:0``,
  and has no option for the address (api/serve_app.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class RayletWorkers:
    """Asks one node's raylet to start idle worker processes."""

    def __init__(self, address: str) -> None:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import node_manager_pb2_grpc

        channel = init_grpc_channel(address, asynchronous=True)
        self._stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)

    async def prestart(self, count: int, keep_alive_seconds: int, runtime_env: str | None, timeout: float) -> None:
        """``count`` idle Python workers that live ``keep_alive_seconds`` unless used; with
        ``runtime_env`` (serialised), for actors of that runtime env only."""
        from ray.core.generated import common_pb2, node_manager_pb2

        request = node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.Language.PYTHON, num_workers=count, keep_alive_duration_secs=keep_alive_seconds)
        if runtime_env and runtime_env not in ("{}", ""):
            from ray._private.utils import get_runtime_env_info
            from ray.runtime_env import RuntimeEnv

            request.runtime_env_info.CopyFrom(get_runtime_env_info(RuntimeEnv.deserialize(runtime_env)))
        await self._stub.PrestartWorkers(request, timeout=timeout)


def rewrite_replica_grpc_address(rewrite: Callable[[str], str]) -> None:
    """From now on, in this process, Serve binds a replica's gRPC server to ``rewrite(address)``."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server

    def bind_rewritten(server: Any, address: str) -> int:
        return int(bind(server, rewrite(address)))

    replica.add_port_to_grpc_server = bind_rewritten
