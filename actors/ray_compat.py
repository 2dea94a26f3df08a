"""Every use of Ray's private APIs, in one place.

Checked against Ray 2.60.0 (pyproject.toml pins ``ray>=2.60,<2.61``); a new Ray version must
be checked here first (tests/actors/test_runtime.py checks the preload,
tests/hostile/test_api_exposure.py checks the Serve rebinding):

- ``preload_options``: ``ray.init``'s private ``_system_config`` with ``preload_python_modules``,
  so every worker process a Ray started by Canopy spawns imports Canopy's actor modules before
  an actor is placed on it (actors/runtime.py; tests/actors/test_runtime.py checks it).
- ``rewrite_replica_grpc_address``: Serve starts each replica's inter-deployment gRPC
  server through ``ray.serve._private.replica.add_port_to_grpc_server`` with ``[::]:0``,
  and has no option for the address (api/serve_app.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def preload_options(modules: Sequence[str]) -> dict[str, Any]:
    """``ray.init`` options that make every worker process import ``modules`` as it starts."""
    return {"_system_config": {"preload_python_modules": list(modules)}}


def rewrite_replica_grpc_address(rewrite: Callable[[str], str]) -> None:
    """From now on, in this process, Serve binds a replica's gRPC server to ``rewrite(address)``."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server

    def bind_rewritten(server: Any, address: str) -> int:
        return int(bind(server, rewrite(address)))

    replica.add_port_to_grpc_server = bind_rewritten
