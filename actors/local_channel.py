"""Calls between Canopy's actors on one node over Unix sockets, for the two hottest calls:
model calls to the ModelGateway and activation hints to the shared session hosts.

Every model step of every Run is one gateway call, and every slot grant one hint, so their
transport sits on every Run's critical path. A Ray actor call between two processes of this
machine that were idle during a 200 ms model call takes ~1.7 ms there and ~0.7 ms back (3 and
2 ms under a fan-out's load: Ray's threads have to wake on both sides); a Unix socket between
the same event loops takes ~0.2 ms. So these actors also listen on a socket, and a caller on
their node sends the call there. Ray stays the control plane: it places, names and restarts
the actors, the socket's address is asked of the actor by an actor call, and a caller on
another node (or one that cannot connect) makes the actor call itself. Calls made this way
are not listed as Ray tasks in the dashboard.

Frames are a 4-byte length and a JSON object — never pickles: anything that can open the
socket could otherwise run code in the actor. The socket lives in a directory of its own,
private to the actor's user (mode 0700). A request is ``{"id", "method", "args"}`` or
``{"id", "cancel": true}``; a reply is ``{"id", "reply"}`` or ``{"id", "error"}``. A closed
connection cancels its calls still running in the actor (their caller is gone) and fails the
calls still waiting in the caller with :class:`ChannelClosed`, as a dead actor's call fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import socket
import struct
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import ray

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
# A model call's messages are the session's history: large, but not without bound.
MAX_FRAME_BYTES = 256 * 1024 * 1024
# How long a caller waits for a restarting actor (Ray restarts one in about a second here).
RESTART_WAIT_SECONDS = 60.0

Handler = Callable[..., Awaitable[Any]]


class ChannelError(Exception):
    """The called method failed in the actor; the message is its error's."""


class ChannelClosed(ChannelError, ConnectionError):
    """The connection to the actor closed (the actor died) before the call was answered."""


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return json.loads(await reader.readexactly(length))


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, default=str).encode()
    return _LENGTH.pack(len(body)) + body


# ---------------------------------------------------------------------------
# The called actor's side
# ---------------------------------------------------------------------------

_DIRECTORY_PREFIX = "canopy-channel-"
_SOCKET_NAME = "calls.sock"


def remove_dead_channels(min_age_seconds: float = 60.0) -> list[Path]:
    """Remove the socket directories of actors that died without closing them (killed or
    crashed processes), so restarts do not pile them up: a directory of this user whose
    socket no longer accepts connections. One younger than ``min_age_seconds`` is left alone:
    another actor may be between creating it and listening in it. Returns what was removed."""
    removed = []
    for directory in Path(tempfile.gettempdir()).glob(_DIRECTORY_PREFIX + "*"):
        with contextlib.suppress(OSError):
            info = directory.stat()
            if info.st_uid != os.getuid() or time.time() - info.st_mtime < min_age_seconds:
                continue
            if _accepts(directory / _SOCKET_NAME):
                continue
            shutil.rmtree(directory)
            removed.append(directory)
    return removed


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # not provably dead (busy, or not ours to judge): leave it
    return True


class ChannelServer:
    """An actor's socket: each request runs ``handlers[method](**args)`` as a task of its own."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        self._handlers = handlers
        self._server: asyncio.Server | None = None
        self._directory: Path | None = None
        self._lock = asyncio.Lock()

    async def address(self) -> dict[str, str]:
        """Where to connect (started on first use): this node's Ray id and the socket's path."""
        async with self._lock:
            if self._server is None:
                remove_dead_channels()
                self._directory = Path(tempfile.mkdtemp(prefix=_DIRECTORY_PREFIX))  # mode 0700
                self._server = await asyncio.start_unix_server(self._serve, self._directory / _SOCKET_NAME)
            return {"node_id": ray.get_runtime_context().get_node_id(), "path": str(self._directory / _SOCKET_NAME)}

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
                task = asyncio.create_task(self._answer(writer, sending, call_id, message))
                running[call_id] = task
                task.add_done_callback(lambda _, call_id=call_id: running.pop(call_id, None))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError, TypeError) as error:
            if not isinstance(error, asyncio.IncompleteReadError) or error.partial:
                log.warning("closing a channel connection: %s", error)
        finally:
            for task in list(running.values()):  # the caller is gone: its calls stop too
                task.cancel()
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, sending: asyncio.Lock, call_id: int,
                      message: dict[str, Any]) -> None:
        try:
            handler = self._handlers.get(str(message.get("method")))
            if handler is None:
                raise ChannelError(f"no method {message.get('method')!r} on this channel")
            answer = {"id": call_id, "reply": await handler(**message["args"])}
        except Exception as error:  # the caller's call fails with it
            answer = {"id": call_id, "error": str(error)}
        async with sending:
            with contextlib.suppress(ConnectionError):
                writer.write(_frame(answer))
                await writer.drain()


# ---------------------------------------------------------------------------
# The caller's side
# ---------------------------------------------------------------------------


class _Channel:
    """One connection to an actor, shared by the calls of one event loop."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._name = name
        self._writer = writer
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._reading = asyncio.create_task(self._read_answers(reader))

    @property
    def open(self) -> bool:
        return not self._reading.done()

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        if not self.open:
            raise ChannelClosed(f"the connection to {self._name} closed")
        call_id = next(self._ids)
        answer = self._waiting[call_id] = asyncio.get_running_loop().create_future()
        try:
            self._writer.write(_frame({"id": call_id, "method": method, "args": args}))
            return await answer
        except asyncio.CancelledError:
            if self.open:  # stop the call in the actor too, as ray.cancel does
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
                    answer.set_exception(ChannelError(str(message.get("error"))))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError, TypeError) as error:
            log.warning("the channel to %s closed: %r", self._name, error)
        finally:
            self._writer.close()
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(ChannelClosed(f"the connection to {self._name} closed during the call"))


class _Unreachable:
    """The actor cannot be reached over its socket from here (another node, or no access)."""


# Per event loop, per actor name: a connection, or the verdict that calls go through Ray.
_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Channel | _Unreachable]] = (
    weakref.WeakKeyDictionary())
_connecting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary())


async def _address(handle: Any) -> dict[str, str]:
    """The actor's socket address; an actor that is restarting is waited for (asking is
    harmless to repeat), one that is gone for good raises."""
    deadline = time.monotonic() + RESTART_WAIT_SECONDS
    while True:
        try:
            return await handle.channel_address.remote()
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _channel(handle: Any, name: str) -> _Channel | None:
    """This event loop's connection to the actor ``name``; None when calls must go through Ray."""
    loop = asyncio.get_running_loop()
    channels = _channels.setdefault(loop, {})
    channel = channels.get(name)
    if isinstance(channel, _Channel) and channel.open:  # every call but the first: no lock
        return channel
    locks = _connecting.setdefault(loop, {})
    if name not in locks:
        locks[name] = asyncio.Lock()
    async with locks[name]:
        channel = channels.get(name)
        if isinstance(channel, _Unreachable):
            return None
        if channel is not None and channel.open:
            return channel
        # None, or closed: the actor restarted (a new process has a new socket) or went away.
        address = await _address(handle)
        if address["node_id"] != ray.get_runtime_context().get_node_id():
            channels[name] = _Unreachable()
            return None
        try:
            reader, writer = await asyncio.open_unix_connection(address["path"])
        except OSError as error:
            log.warning("the socket %s of %s is not reachable (%s): calls go through Ray",
                        address["path"], name, error)
            channels[name] = _Unreachable()
            return None
        channel = channels[name] = _Channel(name, reader, writer)
        return channel


async def call(handle: Any, name: str, method: str, **args: Any) -> Any:
    """``handle.method(**args)`` for the actor named ``name``: over its socket when it runs on
    this node, else as a Ray actor call.

    Cancelling the awaiting task cancels the call in the actor in either transport. Over the
    socket, a call whose connection closes (the actor died) raises :class:`ChannelClosed` and
    a method that fails raises :class:`ChannelError` with its message.
    """
    channel = await _channel(handle, name)
    if channel is not None:
        return await channel.call(method, args)
    ref = getattr(handle, method).remote(**args)
    try:
        return await ref
    except asyncio.CancelledError:
        ray.cancel(ref)
        raise
