"""Server-Sent Events over the committed events table.

A stream replays every event after its cursor (``?after=N`` or ``Last-Event-ID: N``; the route
turns ``?after=latest`` into the scope's latest cursor when the stream opens), oldest first,
then follows live ones. Event cursors come from a per-scope counter that is locked
until commit (persistence/events.py), so a reader that has seen cursor N never later sees a
smaller one commit: re-reading ``cursor > last sent`` loses nothing and repeats nothing.
Each event's SSE ``id:`` is its cursor. Model text deltas, which are not durable and have no
cursor, go out as ``event: delta`` without an ``id:`` so they never move a client's resume point.

An API key holds at most ``CANOPY_MAX_STREAMS_PER_KEY`` open streams across all replicas: each
stream holds a place (a row of ``open_streams``, persistence/open_streams.py) that its response
renews while open (beside the body, which a client that stops reading blocks) and frees when it
closes: at once when its client went, and when the stream ended by itself (its byte budget) only
once its client may have read what it was sent (``StreamSettings.drain_bytes_per_second``), since
Serve's proxy holds what a client has not read after the replica is done with it. A replica that
dies frees its places when they expire (``StreamSettings.lease_seconds``). Counting in PostgreSQL
rather than per replica costs a write per open, close and renewal, and makes the limit the same
however many replicas serve the key. Renewing also re-checks the key: a stream of a revoked or
expired key ends (at once when the revocation's notification arrives, api/hub.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from api.hub import EventHub, Subscription
from api.schemas import Event
from persistence import open_streams, stream_watchers, views
from persistence.db import Database
from persistence.events import events_page
from persistence.records import Row
from persistence.records import Scope as CanopyScope

log = logging.getLogger(__name__)

_BATCH = 500
# What one read of a stream's events holds at most (the first event always comes, whatever its size).
_BATCH_BYTES = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    heartbeat_seconds: float = 15.0  # a comment line keeps idle connections (and proxies) open
    poll_seconds: float = 5.0  # safety re-read while the listener is healthy
    fallback_poll_seconds: float = 0.5  # re-read interval while the listener is down
    retry_ms: int = 2000  # the reconnection delay suggested to EventSource clients
    # A stream with deltas marks its tree as watched this long, renewed while it stays open
    # (persistence/stream_watchers.py: unwatched model calls are not streamed at all).
    watch_seconds: float = 60.0
    watch_refresh_seconds: float = 20.0
    # A stream's place among its key's open streams lasts this long, renewed while it is open.
    lease_seconds: float = 60.0
    lease_refresh_seconds: float = 20.0
    # A stream ends once it has sent this much (the client resumes from its Last-Event-ID). Serve
    # passes a stream on without waiting for its reader: one that stopped reading would otherwise
    # have a whole tree's history, and everything after, held in the proxy's memory.
    max_bytes: int = 16 * 2**20
    # A stream that ended by itself (its byte budget, or its archived tree all sent) keeps its place
    # as long as its client takes to read what it was sent at this rate: under Serve the response is
    # over for the replica while the proxy still holds what the client has not read, and a place
    # freed then let a client that never reads open stream after stream, each held in the proxy.
    drain_bytes_per_second: float = 128 * 1024


@dataclasses.dataclass(frozen=True)
class StreamLease:
    """A stream's place among the open streams of its API key."""

    db: Database
    stream_id: uuid.UUID
    key_id: uuid.UUID

    async def renew(self, seconds: float) -> bool:
        """Hold the place longer; False when the key is no longer live (the stream must end)."""
        try:
            async with self.db.tx() as conn:
                return await open_streams.renew_stream(conn, self.stream_id, seconds)
        except Exception:  # a database hiccup must not end a healthy stream; the next renewal retries
            log.warning("renewing the place of stream %s failed", self.stream_id, exc_info=True)
            return True

    async def release(self, after_seconds: float = 0.0) -> None:
        """Free the place, at once or once ``after_seconds`` have passed (at once for a key no
        longer live: its streams are over, and so are its places)."""
        try:
            async with self.db.tx() as conn:
                if after_seconds <= 0 or not await open_streams.renew_stream(conn, self.stream_id, after_seconds):
                    await open_streams.close_stream(conn, self.stream_id)
        except Exception:  # the place expires on its own
            log.warning("freeing the place of stream %s failed", self.stream_id, exc_info=True)


class EventStreamResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], lease: StreamLease | None = None,
                 settings: StreamSettings | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.lease = lease
        self.settings = settings or StreamSettings()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = 0
        ended = False  # the body ended by itself: its last message went out
        opened = time.monotonic()

        async def counting(message: Message) -> None:
            nonlocal sent, ended
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                ended = not message.get("more_body", False)
            await send(message)

        try:
            if self.lease is None:
                await super().__call__(scope, receive, counting)
            else:
                await self._send_holding(self.lease, scope, receive, counting)
        finally:
            # Close the generator now (not at garbage collection) so its subscription is freed
            # as soon as the client goes away, and free the stream's place: at once when the client
            # went or the key ended it, else once the client may have read what it was sent.
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
            if self.lease is not None:
                # A stream that took longer than that to send its bytes was read as it went.
                unread = sent / self.settings.drain_bytes_per_second - (time.monotonic() - opened)
                await self.lease.release(max(0.0, unread) if ended else 0.0)

    async def _send_holding(self, lease: StreamLease, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the stream while a task beside it renews its place, and end it when the key is no
        longer live. The place is renewed here, not in the body's generator: under uvicorn a client
        that stops reading blocks the generator in a send, and a place renewed there expired while
        the stream stayed open, so a key could hold any number of stuck streams."""
        sending = asyncio.create_task(super().__call__(scope, receive, send))
        holding = asyncio.create_task(self._hold(lease, sending))
        try:
            await sending
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if holding.cancelled() or not holding.done() or (current is not None and current.cancelling()):
                raise
            # The key is no longer live: the response ends here, as the generator's return ends it.
        finally:
            holding.cancel()
            sending.cancel()

    async def _hold(self, lease: StreamLease, sending: asyncio.Task[None]) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_refresh_seconds)
            if not await lease.renew(self.settings.lease_seconds):
                sending.cancel()
                return


def format_event(row: Row) -> bytes:
    data = Event.model_validate(row).model_dump_json()
    return f"id: {row['cursor']}\ndata: {data}\n\n".encode()


def format_delta(delta: dict[str, Any]) -> bytes:
    return f"event: delta\ndata: {json.dumps(delta, separators=(',', ':'))}\n\n".encode()


def _target(subscription: Subscription) -> dict[str, uuid.UUID | None]:
    return {"session_id": uuid.UUID(subscription.session_id) if subscription.session_id else None,
            "tree_id": uuid.UUID(subscription.tree_id) if subscription.tree_id else None}


async def _due_events(db: Database, scope: CanopyScope, cursor: int, subscription: Subscription
                      ) -> tuple[list[Row], bool]:
    async with db.tx() as conn:
        return await events_page(conn, scope, cursor, limit=_BATCH, max_bytes=_BATCH_BYTES, **_target(subscription))


async def _finished(db: Database, scope: CanopyScope, cursor: int, subscription: Subscription) -> bool:
    async with db.tx() as conn:
        return await views.stream_finished(conn, scope, after=cursor, **_target(subscription))


async def _renew_watch(db: Database, tree_id: uuid.UUID, seconds: float) -> None:
    try:
        async with db.tx() as conn:
            await stream_watchers.watch(conn, tree_id, seconds)
    except Exception:  # the live text may pause; the stream and its events go on
        log.warning("renewing the watch of tree %s failed", tree_id, exc_info=True)


async def event_stream(hub: EventHub, db: Database, scope: CanopyScope, *, after: int,
                       session_id: uuid.UUID | None = None, tree_id: uuid.UUID | None = None,
                       watched_tree_id: uuid.UUID | None = None, settings: StreamSettings | None = None,
                       lease: StreamLease | None = None) -> AsyncGenerator[bytes, None]:
    """The stream body. The caller has already checked that the session or tree is in the scope.

    With ``watched_tree_id`` (the caller marked that tree as watched when it opened the stream)
    the stream carries live deltas and renews the mark while it is open. With ``lease`` (the
    place the caller took for the stream among its key's streams, which EventStreamResponse
    renews) it re-checks the key as soon as the key changes, and ends when it is no longer live.
    It also ends after ``settings.max_bytes``, between two events: the client comes back with the
    last one's id; and once its tree is archived and every event of it is sent (found when a read
    finds nothing new: the route answers the reconnect with 204, and EventSource stays away)."""
    settings = settings or StreamSettings()
    with hub.subscribe(scope, session_id=str(session_id) if session_id else None,
                       tree_id=str(tree_id) if tree_id else None,
                       deltas=watched_tree_id is not None,
                       key_id=str(lease.key_id) if lease else None) as subscription:
        yield f"retry: {settings.retry_ms}\n\n".encode()
        sent = 0
        cursor = after
        last_write = next_poll = time.monotonic()
        next_watch = last_write + settings.watch_refresh_seconds
        while sent < settings.max_bytes:
            if lease is not None and subscription.key_changed:  # at once; the response renews it meanwhile
                subscription.key_changed = False
                if not await lease.renew(settings.lease_seconds):
                    return  # the key was revoked or has expired
            if watched_tree_id is not None and time.monotonic() >= next_watch:
                await _renew_watch(db, watched_tree_id, settings.watch_seconds)
                next_watch = time.monotonic() + settings.watch_refresh_seconds
            # Deltas first: every delta already here was published before any event read below
            # committed (notifications arrive in commit order), so a client sees a model call's
            # text before the event of the message it became.
            while subscription.deltas and sent < settings.max_bytes:
                chunk = format_delta(subscription.deltas.popleft())
                sent += len(chunk)
                yield chunk
                last_write = time.monotonic()
            now = time.monotonic()
            if subscription.events_due or now >= next_poll:
                # Clear before reading: a notification arriving during the read sets it again.
                subscription.events_due = False
                rows, more = await _due_events(db, scope, cursor, subscription)
                for row in rows:
                    if sent >= settings.max_bytes:
                        return  # the rest from this cursor, when the client comes back
                    cursor = row["cursor"]
                    chunk = format_event(row)
                    sent += len(chunk)
                    yield chunk
                if rows:
                    last_write = time.monotonic()
                elif await _finished(db, scope, cursor, subscription):
                    return  # its tree is archived and all of it was sent: the reconnect gets 204
                if more:
                    continue
                poll = settings.poll_seconds if hub.listening else settings.fallback_poll_seconds
                next_poll = time.monotonic() + poll
            now = time.monotonic()
            if now - last_write >= settings.heartbeat_seconds:
                yield b": keep-alive\n\n"
                last_write = now
            if subscription.events_due or subscription.deltas or subscription.key_changed:
                continue
            subscription.signal.clear()
            timeout = max(0.0, min(next_poll, last_write + settings.heartbeat_seconds) - time.monotonic())
            try:
                await asyncio.wait_for(subscription.signal.wait(), timeout=timeout)
            except TimeoutError:
                pass
