"""Tool receipts: a side-effecting tool call is keyed by (source Turn, tool call id).

The same key with the same arguments returns the stored result and writes nothing;
the same key with other arguments is refused. A new Turn may reuse a call id.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg.types.json import Jsonb

from persistence.db import Connection, query
from persistence.errors import IdempotencyConflict, LeaseLost
from persistence.records import RunRef


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


async def begin_call(
    conn: Connection, run: RunRef, tool_call_id: str, tool_name: str, arguments: dict[str, Any]
) -> Any | None:
    """A side-effecting call begins (one statement): the Run is fenced (LeaseLost if its lease
    is gone), and the stored result of the call is returned, or None when it has not happened."""
    cur = await conn.execute(query("begin_call"), {
        "run_id": run.run_id, "owner": run.owner, "turn_id": run.turn_id, "call_id": tool_call_id})
    row = await cur.fetchone()
    if row is None or not row["fenced"]:
        raise LeaseLost(f"run {run.run_id} is no longer held by {run.owner}")
    if row["tool_name"] is None:
        return None
    if row["tool_name"] != tool_name or row["arguments"] != _canonical(arguments):
        raise IdempotencyConflict(
            f"tool call {tool_call_id!r} of this turn already ran {row['tool_name']} with other arguments; "
            "a replay must repeat the call exactly"
        )
    return row["result"]


async def store_result(
    conn: Connection, run: RunRef, tool_call_id: str, tool_name: str, arguments: dict[str, Any], result: Any
) -> None:
    await conn.execute(
        """INSERT INTO tool_receipts (turn_id, tool_call_id, tool_name, arguments, result, first_run_id)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (run.turn_id, tool_call_id, tool_name, Jsonb(_canonical(arguments)), Jsonb(_canonical(result)),
         run.run_id),
    )
