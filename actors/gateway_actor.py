"""The ModelGateway as a Ray actor, with per-call accounting.

Every model call is recorded in ``model_calls`` here, whether or not the caller lives
to commit the reply: model calls are at-least-once and their cost counts each time.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from actors import metrics
from actors.model_gateway import ModelGateway
from persistence.db import Database

DELTA_CHANNEL = "canopy_deltas"
_RECORD = """
INSERT INTO model_calls (run_id, model, prompt_tokens, completion_tokens, cost_usd, latency_ms, error)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""


class AccountedGateway(ModelGateway):
    _db: Database | None = None

    async def _database(self) -> Database:
        if self._db is None:
            self._db = await Database.connect(max_size=4)
        return self._db

    async def complete_for_run(self, *, run_id: str, watch: dict[str, str] | None = None,
                               **request: Any) -> dict[str, Any]:
        """A model call of one Run. With ``watch`` (session/tree/turn ids) text deltas are
        published live on the ``canopy_deltas`` channel: not persisted, not in the event cursor."""
        started = time.monotonic()
        publish = None if watch is None else self._publisher(run_id, watch)
        try:
            reply = await self.complete(**request, on_delta=publish)
        except Exception as error:
            await self._record(run_id, request["model"], {}, 0.0, started, str(error))
            raise
        await self._record(run_id, request["model"], reply["usage"], reply["cost_usd"], started, None)
        return reply

    def _publisher(self, run_id: str, watch: dict[str, str]) -> Callable[[str], Awaitable[None]]:
        async def publish(delta: str) -> None:
            db = await self._database()
            payload = json.dumps({**watch, "run_id": run_id, "delta": delta})
            async with db.tx() as conn:
                await conn.execute("SELECT pg_notify(%s, %s)", (DELTA_CHANNEL, payload))

        return publish

    async def _record(self, run_id: str, model: str, usage: dict[str, int], cost: float, started: float,
                      error: str | None) -> None:
        latency_ms = (time.monotonic() - started) * 1000
        metrics.record_model_call(model, latency_ms, usage, error)
        db = await self._database()
        async with db.tx() as conn:
            await conn.execute(_RECORD, (uuid.UUID(run_id), model, usage.get("prompt_tokens", 0),
                                         usage.get("completion_tokens", 0), cost, latency_ms, error))


GatewayActor = ray.remote(AccountedGateway)
