"""The HTTP API as a Ray Serve deployment.

``serve deploy serve.yaml`` imports ``api.serve_app:app``; ``canopy up`` and the tests call
``application(env)`` to pass the database URL and settings explicitly. Each replica builds
the FastAPI app in its own process (``build_asgi_app``): its own Runtime handle on the
running cluster, its own connection pool and its own event listener. Replicas share
nothing but PostgreSQL, so any replica can serve any request or stream.
"""

from __future__ import annotations

import ipaddress
from typing import Any, cast

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve.deployment import Application, Deployment

from actors.ray_compat import rewrite_replica_grpc_address
from api.app import create_app

APP_NAME = "canopy"
LOOPBACK = "127.0.0.1"
DEPLOYMENT_NAME = "canopy-api"
# Requests in flight per replica: live event streams stay open for a long time and each one
# counts, so Serve's default of 5 would queue ordinary requests behind a few watchers.
MAX_ONGOING_REQUESTS = 1000


def _internal_grpc_on_loopback() -> None:
    """Ray Serve starts an inter-deployment gRPC server in every replica, bound to ``[::]:0``
    (every interface) whatever the node's address: Ray has no option for it (ray-project/ray#64623
    adds only a port range). It checks Ray's auth token while token authentication is on, but a
    port that answers from outside is still an attack surface, and with ``RAY_AUTH_MODE=disabled``
    it would take unauthenticated calls. On a node whose Ray address is loopback
    (``canopy up`` without ``--expose-ray``) nothing outside the machine may reach it, so the
    replica binds it to loopback instead; Serve's own callers reach a replica at its node's
    address, which is then loopback too. A node with a routable address keeps Serve's binding.
    Runs in the replica after Serve has built it and before it starts that server
    (tests/hostile/test_api_exposure.py checks the result)."""
    if ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
        rewrite_replica_grpc_address(lambda address: address.replace("[::]:", f"{LOOPBACK}:", 1))


def build_asgi_app() -> FastAPI:
    """Evaluated inside each replica at start; the app's lifespan starts its Runtime there."""
    _internal_grpc_on_loopback()
    return create_app()


@serve.deployment(
    name=DEPLOYMENT_NAME,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=MAX_ONGOING_REQUESTS,
    graceful_shutdown_timeout_s=5,
)
@serve.ingress(build_asgi_app)
class CanopyAPI:
    """The ingress deployment; all routes come from ``create_app``."""


# The decorators turn the class into a Deployment (their typing does not say so).
DEPLOYMENT = cast(Deployment, CanopyAPI)


def application(env: dict[str, str] | None = None, num_replicas: int = 1) -> Application:
    """The Serve application with the replicas' environment (database URL, data dir, settings)."""
    options: dict[str, Any] = {"num_cpus": 0, "runtime_env": {"env_vars": dict(env or {})}}
    return DEPLOYMENT.options(ray_actor_options=options, num_replicas=num_replicas).bind()


# For `serve deploy serve.yaml` / `serve run api.serve_app:app`: the environment comes from
# the config's runtime_env and from the cluster's own environment.
app = DEPLOYMENT.bind()
