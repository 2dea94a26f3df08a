"""Which model gateway a process calls: the one of its own Ray node, and a call's retry when it dies.

Every node has its own gateway, ``canopy:gateway:<node id>`` (actors/gateway_actor.py), pinned
to the node and created by the first process there that needs it (get-or-create), so a model
call never crosses the cluster and a node that joins needs nothing started by hand. Its
arguments come from the settings of the process that creates it (each worker has the same).

A gateway holds nothing a successor could not rebuild, so a call whose gateway dies under it
(killed, its node's memory monitor, a crash) is asked again instead of failing the Turn: of a
fresh gateway when it is gone for good (up to :data:`CALL_ATTEMPTS` of them), or of the same one
once Ray has restarted its process (``max_restarts``; unavailable meanwhile, each restart for as
long as :data:`RESTART_WAIT_SECONDS`: a restart imports litellm again, seconds on a loaded node;
up to :data:`RESTARTS_PER_CALL` restarts).
Nothing was committed for the lost call (the caller commits the reply and its usage only once
the reply is back), so the retry only re-asks the model and the Run is charged for the reply it
gets, once. The dead gateway never accounted the lost call either: ``model_calls`` rows are
written after a reply is handed back. The provider may have billed the lost request; nothing
here can know, or avoid it. An *unavailable* gateway may not have died at all (Ray: the task
"may or may not have been executed"), so a model call names itself (``call_id``) and a gateway
still running it, or holding its reply, answers the retry from that one provider request.

Each gateway starts its own scripted model (actors/scripted) on first use, in its own process:
a gateway's calls go to its own server (the ``api_base`` is given per call), and it dies with
its gateway, like a provider's connection. Nodes of one machine (``ray.cluster_utils``) share
its addresses, so ``scripted_model_port`` is the port a gateway tries first; one that finds it
taken listens on a free port (ModelGateway.scripted_base_url). They share the request log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import ray

from actors.gateway_actor import GatewayActor, this_process
from actors.model_gateway import ModelGateway
from actors.naming import NAMESPACE, NodeLocal, gateway_actor_name, node_local_options
from persistence.settings import Settings, get_settings

log = logging.getLogger(__name__)

# A call is asked of at most this many gateways: one dying under a call is rare, several in a row
# mean the node is in trouble, and the Turn fails with the error.
CALL_ATTEMPTS = 3
# How long a call waits for its gateway's process to be restarted, each time: a node whose gateway stays
# unavailable longer is in trouble (a node Ray has lost makes the gateway dead, not unavailable).
RESTART_WAIT_SECONDS = 60.0
# How many restarts of its gateway a call lives through: a call whose every ask kills the process
# (a reply too big for its memory) would otherwise crash the node's gateway, and its other calls
# with it, for as long as the call is asked again.
RESTARTS_PER_CALL = 5
# Before asking again (doubling up to the cap): the dead gateway's name is freed and its successor
# placed meanwhile, or its restarted process starts.
_RETRY_PAUSE_SECONDS = 0.2
_RETRY_PAUSE_CAP_SECONDS = 2.0


def secrets_path(settings: Settings) -> Path:
    """``<data dir>/secrets``: where a runtime writes its secrets and its workers read them."""
    return settings.data_dir.expanduser().resolve() / "secrets"


def scripted_log_path(settings: Settings) -> os.PathLike[str]:
    return settings.data_dir / "scripted-requests.jsonl"


def gateway_options(settings: Settings) -> dict[str, Any]:
    """The ModelGateway's arguments, paths absolute: it runs in a worker with a cwd of its own."""
    log_path = str(scripted_log_path(settings)) if settings.scripted_request_log else None
    return {"scripted_port": settings.scripted_model_port, "log_path": log_path,
            "timeout_seconds": settings.model_timeout_seconds, "retries": settings.model_retries,
            "models_file": str(settings.models_file.expanduser().resolve()) if settings.models_file else None,
            "secrets_dir": str(secrets_path(settings)), "provider_env": list(settings.provider_env),
            "agent_api_bases": settings.agent_api_bases, "max_reply_chars": settings.max_reply_chars}


def gateway_here(settings: Settings) -> ModelGateway:
    """A ModelGateway in this process (no Ray) that sees what the runtime's would: the same models
    file, secrets directory and provider variables — for checks made outside the runtime."""
    return ModelGateway(**gateway_options(settings))


def _create(node_id: str) -> Any:
    return GatewayActor.options(**node_local_options(gateway_actor_name(node_id), node_id, max_concurrency=1000)) \
        .remote(node_id=node_id, **gateway_options(get_settings()))


_local = NodeLocal(_create)


async def local_gateway() -> Any:
    """This node's gateway (created on first use)."""
    return await _local.handle()


def gateway_on(node_id: str) -> Any:
    """A node's gateway, if it runs (ValueError if not): for operators and tests."""
    return ray.get_actor(gateway_actor_name(node_id), namespace=NAMESPACE)


async def call(method: str, **arguments: Any) -> Any:
    """``method`` of this node's gateway, asked again when the gateway dies first (see the
    module's docstring). Cancelling the caller cancels the call in the gateway (a model call's
    provider request is aborted). The gateway's own errors (a ModelError) propagate."""
    return await ask(_local, method, **arguments)


async def ask(local: NodeLocal, method: str, **arguments: Any) -> Any:
    """:func:`call`'s retries, for this node's instance of any per-node actor whose calls can be
    asked again (the gateway's; a test's), made by ``liveness.answering_actor``."""
    deaths = restarts = 0
    pause = _RETRY_PAUSE_SECONDS
    while True:
        handle = await local.handle()
        pending = getattr(handle, method).remote(**arguments)
        try:
            return await pending
        except asyncio.CancelledError:
            ray.cancel(pending)
            raise
        except ray.exceptions.ActorUnavailableError as error:  # its process is being restarted
            restarts += 1
            if restarts > RESTARTS_PER_CALL:
                raise
            log.warning("the model gateway is unavailable during %s (%d of %d); asking it again once restarted: %s",
                        method, restarts, RESTARTS_PER_CALL, error)
            await _restarted(local, error)
            continue
        except ray.exceptions.RayActorError as error:  # gone for good: ActorDiedError
            deaths += 1
            if deaths == CALL_ATTEMPTS:
                raise
            log.warning("the model gateway died during %s (%d of %d); asking a fresh one: %s",
                        method, deaths, CALL_ATTEMPTS, type(error).__name__)
            local.forget(handle)
        await asyncio.sleep(pause)
        pause = min(2 * pause, _RETRY_PAUSE_CAP_SECONDS)


async def _restarted(local: NodeLocal, error: ray.exceptions.ActorUnavailableError) -> None:
    """Once the actor's restarted process answers (``answers``, actors/liveness.py: apart from the
    calls, which may fill its slots again at once), or ``error`` raised
    after :data:`RESTART_WAIT_SECONDS`. Each restart gets the whole wait: a long call may live
    through several, each of them quick. An actor that died for good meanwhile returns at once:
    the call's next ask finds that out."""
    try:
        async with asyncio.timeout(RESTART_WAIT_SECONDS):  # a restart that never ends is unavailable for ever
            await _answering(local)
    except TimeoutError:
        raise error from None


async def _answering(local: NodeLocal) -> None:
    pause = _RETRY_PAUSE_SECONDS
    while True:
        try:
            await (await local.handle()).answers.remote()
            return
        except ray.exceptions.ActorUnavailableError:
            pass
        except ray.exceptions.RayActorError:
            return
        await asyncio.sleep(pause)
        pause = min(2 * pause, _RETRY_PAUSE_CAP_SECONDS)


async def complete_for_run(**arguments: Any) -> dict[str, Any]:
    """A model call of a Run (GatewayActor.complete_for_run), named once for all its retries, from
    this process (aborted once it is gone)."""
    return await call("complete_for_run", call_id=uuid.uuid4().hex, caller=this_process(), **arguments)
