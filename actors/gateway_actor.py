"""The ModelGateway as a Ray actor, with per-call accounting.

Every model call is recorded in ``model_calls`` here, whether or not the caller lives
to commit the reply: model calls are at-least-once and their cost counts each time.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import ray

from actors.model_gateway import ModelGateway
from persistence.db import Database

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

    async def complete_for_run(self, *, run_id: str, **request: Any) -> dict[str, Any]:
        started = time.monotonic()
        try:
            reply = await self.complete(**request)
        except Exception as error:
            await self._record(run_id, request["model"], {}, 0.0, started, str(error))
            raise
        await self._record(run_id, request["model"], reply["usage"], reply["cost_usd"], started, None)
        return reply

    async def _record(self, run_id: str, model: str, usage: dict[str, int], cost: float, started: float,
                      error: str | None) -> None:
        db = await self._database()
        async with db.tx() as conn:
            await conn.execute(_RECORD, (uuid.UUID(run_id), model, usage.get("prompt_tokens", 0),
                                         usage.get("completion_tokens", 0), cost,
                                         (time.monotonic() - started) * 1000, error))


GatewayActor = ray.remote(AccountedGateway)
