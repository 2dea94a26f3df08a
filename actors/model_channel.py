"""Model calls from a session's process to the ModelGateway over a Unix socket on the same node.

Every model step of every Run is one gateway call, so its transport sits on every Run's
critical path. A Ray actor call between two processes of this machine that were idle during
a 200 ms model call takes ~1.7 ms there and ~0.7 ms back (3 and 2 ms under a fan-out's load:
Ray's threads have to wake on both sides); a Unix socket between the same event loops takes
~0.2 ms. So the gateway also listens on a socket, and a session on its node sends model calls
there. Ray stays the control plane: it places, names and restarts the gateway, the socket's
address is asked of the gateway by an actor call, and a caller on another node (or one that
cannot connect) makes the actor call itself. Model calls made this way are not listed as Ray
tasks in the dashboard; their records are in ``model_calls`` and the gateway's metrics.

Frames are a 4-byte length and a JSON object — never pickles: anything that can open the
socket could otherwise run code in the gateway. The socket lives in a directory of its own,
private to the gateway's user (mode 0700). A request is ``{"id", "request"}`` (the keyword
arguments of ``complete_for_run``) or ``{"id", "cancel": true}``; a reply is ``{"id", "reply"}``
or ``{"id", "error"}``. A closed connection cancels its calls still running in the gateway (their
caller is gone) and fails the calls still waiting in the caller, as a dead actor's call does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import shutil
import struct
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import ray

from actors.model_gateway import ModelError

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
# A model call's messages are the session's history: large, but not without bound.
MAX_FRAME_BYTES = 256 * 1024 * 1024
# How long a caller waits for a restarting gateway (Ray restarts one in about a second here).
GATEWAY_RESTART_SECONDS = 60.0

Handler = Callable[..., Awaitable[dict[str, Any]]]


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return json.loads(await reader.readexactly(length))


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, default=str).encode()
    return _LENGTH.pack(len(body)) + body


# ---------------------------------------------------------------------------
# The gateway's side
# ---------------------------------------------------------------------------


class ChannelServer:
    """The gateway's socket: each request runs ``handler(**request)`` as a task of its own."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._directory: Path | None = None
        self._lock = asyncio.Lock()

    async def address(self) -> dict[str, str]:
        """Where to connect (started on first use): this node's Ray id and the socket's path."""
        async with self._lock:
            if self._server is None:
                self._directory = Path(tempfile.mkdtemp(prefix="canopy-gateway-"))  # mode 0700
                self._server = await asyncio.start_unix_server(self._serve, self._directory / "model.sock")
            return {"node_id": ray.get_runtime_context().get_node_id(), "path": str(self._directory / "model.sock")}

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        running: dict[int, asyncio.Task[None]] = {}
        sending = asyncio.Lock()
        try:
            while True:
                message = await _read_frame(reader)
                call_id = int(message["id"])
                if message.get("cancel"):
                    if (task := running.get(call_id)) is not None:
                        task.cancel()
                    continue
                task = asyncio.create_task(self._answer(writer, sending, call_id, message["request"]))
                running[call_id] = task
                task.add_done_callback(lambda _, call_id=call_id: running.pop(call_id, None))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError, TypeError) as error:
            if not isinstance(error, asyncio.IncompleteReadError) or error.partial:
                log.warning("closing a model channel connection: %s", error)
        finally:
            for task in list(running.values()):  # the caller is gone: its calls stop too
                task.cancel()
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, sending: asyncio.Lock, call_id: int,
                      request: dict[str, Any]) -> None:
        try:
            answer = {"id": call_id, "reply": await self._handler(**request)}
        except Exception as error:  # ModelError or anything else: the caller's call fails with it
            answer = {"id": call_id, "error": str(error)}
        async with sending:
            with contextlib.suppress(ConnectionError):
                writer.write(_frame(answer))
                await writer.drain()


# ---------------------------------------------------------------------------
# The caller's side
# ---------------------------------------------------------------------------


class _Channel:
    """One connection to the gateway, shared by the calls of one event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._reading = asyncio.create_task(self._read_answers(reader))

    @property
    def open(self) -> bool:
        return not self._reading.done()

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        if not self.open:
            raise ModelError("the model gateway's connection closed")
        call_id = next(self._ids)
        answer = self._waiting[call_id] = asyncio.get_running_loop().create_future()
        try:
            self._writer.write(_frame({"id": call_id, "request": request}))
            return await answer
        except asyncio.CancelledError:
            if self.open:  # abort the provider call too, as ray.cancel does
                self._writer.write(_frame({"id": call_id, "cancel": True}))
            raise
        finally:
            self._waiting.pop(call_id, None)

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await _read_frame(reader)
                answer = self._waiting.get(int(message["id"]))
                if answer is None or answer.done():
                    continue  # a cancelled call's late answer
                if "reply" in message:
                    answer.set_result(message["reply"])
                else:
                    answer.set_exception(ModelError(str(message.get("error"))))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError, TypeError) as error:
            log.warning("the model channel to the gateway closed: %r", error)
        finally:
            self._writer.close()
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(ModelError("the model gateway's connection closed during the call"))


class _Unreachable:
    """The gateway cannot be reached over its socket from here (another node, or no access)."""


_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Channel | _Unreachable] = (
    weakref.WeakKeyDictionary())
_connecting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def _address(gateway: Any) -> dict[str, str]:
    """The gateway's socket address; a gateway that is restarting is waited for (asking is
    harmless to repeat), one that is gone for good raises."""
    deadline = time.monotonic() + GATEWAY_RESTART_SECONDS
    while True:
        try:
            return await gateway.channel_address.remote()
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _channel(gateway: Any) -> _Channel | None:
    """This event loop's connection to the gateway; None when calls must go through Ray."""
    loop = asyncio.get_running_loop()
    lock = _connecting.setdefault(loop, asyncio.Lock())
    async with lock:
        channel = _channels.get(loop)
        if isinstance(channel, _Unreachable):
            return None
        if channel is not None and channel.open:
            return channel
        # None, or closed: the gateway restarted (a new process has a new socket) or went away.
        address = await _address(gateway)
        if address["node_id"] != ray.get_runtime_context().get_node_id():
            _channels[loop] = _Unreachable()
            return None
        try:
            reader, writer = await asyncio.open_unix_connection(address["path"])
        except OSError as error:
            log.warning("the model gateway's socket %s is not reachable (%s): model calls go through Ray",
                        address["path"], error)
            _channels[loop] = _Unreachable()
            return None
        channel = _channels[loop] = _Channel(reader, writer)
        return channel


async def complete_for_run(gateway: Any, **request: Any) -> dict[str, Any]:
    """``gateway.complete_for_run(**request)``: over the socket when the gateway is on this node.

    Cancelling the awaiting task aborts the provider call in either transport. A call whose
    connection closes (the gateway died) fails with ModelError, as a dead actor's call fails.
    """
    channel = await _channel(gateway)
    if channel is not None:
        return await channel.call(request)
    ref = gateway.complete_for_run.remote(**request)
    try:
        return await ref
    except asyncio.CancelledError:
        ray.cancel(ref)
        raise

