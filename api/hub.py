"""One PostgreSQL listener per API process, waking the live streams it serves.

Every committed event fires ``NOTIFY canopy_events`` (a trigger in schema.sql) with where
it happened (user, app, session, tree); the ModelGateway publishes text deltas on
``canopy_deltas``; a revoked (or re-dated, or deleted) API key fires ``canopy_keys`` with
its id, which the hub passes to ``on_keys_changed`` (the API's key cache, api/auth.py) and
to the streams that key holds, so they re-check it at once. A (re)connect reports
``on_keys_changed(None)``: notifications may have been missed.

The hub only *wakes* streams: each stream re-reads the committed events
table after its cursor, so a missed or folded notification can delay a stream but never
lose or reorder an event, and any replica can serve any stream. While the listener is
down (or before its first connect) streams fall back to polling.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from actors.gateway_actor import DELTA_CHANNEL
from persistence import notifications
from persistence.db import ping, tcp_bounds
from persistence.records import Scope

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "canopy_events"
KEYS_CHANNEL = "canopy_keys"
_MAX_BUFFERED_DELTAS = 1000


@dataclasses.dataclass(eq=False)
class Subscription:
    """One live stream's mailbox: a flag for "committed events may be due", and live deltas."""

    scope: Scope
    session_id: str | None
    tree_id: str | None
    want_deltas: bool
    key_id: str | None = None
    events_due: bool = True
    key_changed: bool = False  # its key was revoked or re-dated: the stream must re-check it
    signal: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    deltas: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=_MAX_BUFFERED_DELTAS))

    @property
    def target(self) -> str:
        return f"s:{self.session_id}" if self.session_id else f"t:{self.tree_id}"

    def wake(self) -> None:
        self.events_due = True
        self.signal.set()

    def key_change(self) -> None:
        self.key_changed = True
        self.signal.set()

    def push_delta(self, delta: dict[str, Any]) -> None:
        # Deltas are best-effort (not durable, not in the cursor): a slow reader drops the oldest.
        if self.want_deltas:
            self.deltas.append(delta)
            self.signal.set()


class EventHub:
    def __init__(self, database_url: str, *, reconnect_seconds: float = 1.0, liveness_seconds: float = 10.0,
                 on_keys_changed: Callable[[str | None], None] | None = None) -> None:
        self.database_url = database_url
        self.reconnect_seconds = reconnect_seconds
        # How often the listening connection is asked to answer (a ping with this long to come
        # back): one a NAT or load balancer dropped without a word, or whose database host vanished,
        # otherwise looks alive until the OS's keepalive gives up (two hours by default), and
        # meanwhile live text stops, events wait for the safety poll and revoked keys stay cached.
        self.liveness_seconds = liveness_seconds
        self.on_keys_changed = on_keys_changed
        self.listening = False
        self._by_target: dict[str, set[Subscription]] = collections.defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    @property
    def subscriber_count(self) -> int:
        return sum(len(subs) for subs in self._by_target.values())

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen_forever(), name="canopy-event-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self.listening = False

    @contextlib.contextmanager
    def subscribe(self, scope: Scope, *, session_id: str | None = None, tree_id: str | None = None,
                  deltas: bool = True, key_id: str | None = None) -> Iterator[Subscription]:
        """Register a stream (of the API key ``key_id``) for the duration of the ``with`` block
        (a disconnect ends the block)."""
        if (session_id is None) == (tree_id is None):
            raise ValueError("subscribe to exactly one of a session and a tree")
        subscription = Subscription(scope, session_id, tree_id, deltas, key_id)
        self._by_target[subscription.target].add(subscription)
        try:
            yield subscription
        finally:
            subs = self._by_target.get(subscription.target)
            if subs is not None:
                subs.discard(subscription)
                if not subs:
                    del self._by_target[subscription.target]

    def _wake_all(self) -> None:
        for subs in self._by_target.values():
            for subscription in subs:
                subscription.wake()

    def _matching(self, session_id: Any, tree_id: Any) -> Iterator[Subscription]:
        for target in (f"s:{session_id}" if session_id else None, f"t:{tree_id}" if tree_id else None):
            if target is not None:
                yield from list(self._by_target.get(target, ()))

    def _on_event(self, payload: str) -> None:
        try:
            user_id, app_id, session_id, tree_id = json.loads(payload)
        except (ValueError, TypeError):
            self._wake_all()  # an oversized or unknown payload: let every stream re-read
            return
        for subscription in self._matching(session_id, tree_id):
            if subscription.scope == Scope(user_id, app_id):
                subscription.wake()

    def _on_key(self, key_id: str | None) -> None:
        if self.on_keys_changed is not None:
            self.on_keys_changed(key_id)
        for subs in self._by_target.values():
            for subscription in subs:
                if subscription.key_id is not None and key_id in (None, subscription.key_id):
                    subscription.key_change()

    def _on_delta(self, payload: str) -> None:
        try:
            delta = json.loads(payload)
        except ValueError:
            return
        if not isinstance(delta, dict):
            return
        # Session and tree ids are global UUIDs and every stream was authorised for its own
        # session or tree, so matching the id keeps a delta inside its scope.
        for subscription in self._matching(delta.get("session_id"), delta.get("tree_id")):
            subscription.push_delta(delta)

    async def _listen_forever(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.database_url, autocommit=True, connect_timeout=max(1, round(self.liveness_seconds)),
                        **tcp_bounds(self.database_url)) as conn:
                    for channel in (EVENTS_CHANNEL, DELTA_CHANNEL, KEYS_CHANNEL):
                        await notifications.listen(conn, channel)
                    self.listening = True
                    # Anything committed while nobody listened is found by the re-read, and
                    # every key checked meanwhile is checked again.
                    self._on_key(None)
                    self._wake_all()
                    while True:
                        async for note in conn.notifies(timeout=self.liveness_seconds):
                            if note.channel == EVENTS_CHANNEL:
                                self._on_event(note.payload)
                            elif note.channel == KEYS_CHANNEL:
                                self._on_key(note.payload)
                            else:
                                self._on_delta(note.payload)
                        async with asyncio.timeout(self.liveness_seconds):
                            await ping(conn)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("event listener lost its connection; streams poll until it is back", exc_info=True)
            finally:
                self.listening = False
            self._wake_all()
            await asyncio.sleep(self.reconnect_seconds)
