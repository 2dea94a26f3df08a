"""Calls over an actor's Unix socket, as model calls use it: a real gateway actor (real litellm,
the real scripted model, records in the test database) called from a real Ray actor on the same
node. The session hosts' hints use the same channel (tests/actors/test_session_hosts.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import ray

from actors import local_channel
from actors.gateway_actor import GatewayActor
from actors.runtime import Runtime
from actors.scripted import say
from tests.actors.helpers import GATEWAY, channel_caller, eventually, model_request, rows, scenario_findings

pytestmark = pytest.mark.asyncio(loop_scope="session")

@pytest_asyncio.fixture(loop_scope="session")
async def gateway(runtime: Runtime) -> AsyncIterator[Any]:
    actor = GatewayActor.options(max_concurrency=1000, num_cpus=0, max_restarts=-1).remote(
        timeout_seconds=30, retries=0)
    yield actor
    ray.kill(actor, no_restart=True)


@pytest_asyncio.fixture(loop_scope="session")
async def caller(gateway: Any) -> AsyncIterator[Any]:
    actor = channel_caller().remote(gateway)
    yield actor
    ray.kill(actor)


async def recorded_calls(runtime: Runtime, run_id: str) -> list[dict[str, Any]]:
    return await rows(runtime.db, "SELECT model, error FROM model_calls WHERE run_id = %s", uuid.UUID(run_id))


async def in_flight(gateway: Any) -> int:
    return await gateway.scripted_in_flight_requests.remote()


async def nothing_in_flight(gateway: Any) -> bool:
    return await in_flight(gateway) == 0


async def test_a_call_goes_over_the_private_socket_and_is_accounted(runtime: Runtime, gateway: Any,
                                                                   caller: Any) -> None:
    run_id = str(uuid.uuid4())
    reply = await caller.call.remote(**model_request(run_id, say("over the socket")))
    assert reply["message"]["content"] == "over the socket"
    assert await caller.transport.remote() == "_Channel"
    assert await eventually(lambda: recorded_calls(runtime, run_id)) == [{"model": "canopy/scripted", "error": None}]
    address = await gateway.channel_address.remote()
    assert os.stat(Path(address["path"]).parent).st_mode & 0o077 == 0, "other users could reach the gateway"


async def test_cancelling_a_call_aborts_the_provider_request(gateway: Any, caller: Any) -> None:
    await caller.start.remote(**model_request(str(uuid.uuid4()), say("never", delay_ms=10_000)))
    await eventually(lambda: in_flight(gateway), timeout=10)
    await caller.cancel.remote()
    assert (await caller.outcome.remote()).startswith("CancelledError")
    assert await eventually(lambda: nothing_in_flight(gateway), timeout=2), "the provider call kept running"
    reply = await caller.call.remote(**model_request(str(uuid.uuid4()), say("still here")))
    assert reply["message"]["content"] == "still here"


async def test_a_killed_gateway_fails_its_calls_and_the_restarted_one_is_reached_again(
        runtime: Runtime, gateway: Any, caller: Any) -> None:
    await caller.call.remote(**model_request(str(uuid.uuid4()), say("first")))
    before = await gateway.channel_address.remote()
    lost = str(uuid.uuid4())
    await caller.start.remote(**model_request(lost, say("lost", delay_ms=10_000)))
    await eventually(lambda: in_flight(gateway), timeout=10)
    ray.kill(gateway, no_restart=False)
    assert await caller.outcome.remote() == f"ChannelClosed: the connection to {GATEWAY} closed during the call"
    reply = await caller.call.remote(**model_request(str(uuid.uuid4()), say("after the restart")))
    assert reply["message"]["content"] == "after the restart"
    assert await caller.transport.remote() == "_Channel"
    assert (await gateway.channel_address.remote())["path"] != before["path"]
    assert await recorded_calls(runtime, lost) == []  # the dead gateway never answered it


async def test_a_socket_that_cannot_be_reached_leaves_calls_to_ray(gateway: Any, caller: Any) -> None:
    address = await gateway.channel_address.remote()
    os.remove(address["path"])  # as if the caller could not see the gateway's files
    reply = await caller.call.remote(**model_request(str(uuid.uuid4()), say("through Ray")))
    assert reply["message"]["content"] == "through Ray"
    assert await caller.transport.remote() == "_Unreachable"


async def test_malformed_frames_close_their_connection_and_a_bad_request_fails_alone(
        runtime: Runtime, gateway: Any, caller: Any) -> None:
    path = (await gateway.channel_address.remote())["path"]
    for frame in (struct.pack("!I", 9) + b"not json!", struct.pack("!I", 2**31)):
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(frame)
        assert await asyncio.wait_for(reader.read(), timeout=5) == b"", "the connection stayed open"
        writer.close()

    run_id = str(uuid.uuid4())
    reader, writer = await asyncio.open_unix_connection(path)
    for message in ({"id": 7, "method": "complete_for_run", "args": {**model_request(run_id, say("x")), "unknown": 1}},
                    {"id": 8, "method": "close", "args": {}}):
        body = json.dumps(message).encode()
        writer.write(struct.pack("!I", len(body)) + body)
    answers = {}
    for _ in range(2):
        (length,) = struct.unpack("!I", await asyncio.wait_for(reader.readexactly(4), timeout=10))
        answer = json.loads(await reader.readexactly(length))
        answers[answer["id"]] = answer["error"]
    assert "unexpected keyword argument 'unknown'" in answers[7]
    assert answers[8] == "no method 'close' on this channel"  # only what the actor serves on it
    writer.close()

    reply = await caller.call.remote(**model_request(str(uuid.uuid4()), say("unharmed")))
    assert reply["message"]["content"] == "unharmed"
    # Accounted like any failed call (an actor call with the same arguments is too).
    assert await eventually(lambda: recorded_calls(runtime, run_id)) == [
        {"model": "canopy/scripted", "error": "ModelGateway.complete() got an unexpected keyword argument 'unknown'"}]


async def test_dead_actors_socket_directories_are_removed_and_live_or_new_ones_kept() -> None:
    def channel_directory(age_seconds: float) -> Path:
        directory = Path(tempfile.mkdtemp(prefix="canopy-channel-"))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(str(directory / "calls.sock"))  # bound, then closed: no one listens
        os.utime(directory, (time.time() - age_seconds,) * 2)
        return directory

    dead_old, dead_new = channel_directory(120), channel_directory(0)
    live = Path(tempfile.mkdtemp(prefix="canopy-channel-"))
    server = await asyncio.start_unix_server(lambda r, w: w.close(), live / "calls.sock")
    os.utime(live, (time.time() - 120,) * 2)
    try:
        removed = local_channel.remove_dead_channels()
        assert dead_old in removed and not dead_old.exists()
        assert dead_new.exists() and live.exists()  # too young to judge; still listening
    finally:
        server.close()
        for directory in (dead_new, live):
            shutil.rmtree(directory, ignore_errors=True)


async def test_a_caller_on_another_node_makes_actor_calls(database_url: str) -> None:
    findings = await scenario_findings("tests.actors.multinode_scenario", {"CANOPY_DATABASE_URL": database_url},
                                       timeout=240)
    assert findings == {
        "gateway_node": {"reply": "from gateway_node", "transport": "_Channel"},
        "other_node": {"reply": "from other_node", "transport": "_Unreachable"},  # no socket across nodes
    }
