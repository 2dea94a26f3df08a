"""Tool receipts: a side-effecting tool call is keyed by (source Turn, tool call id).

The same key with the same arguments returns the stored result and writes nothing;
the same key with other arguments is refused. A new Turn may reuse a call id.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from psycopg.types.json import Jsonb

from persistence import metrics
from persistence.db import Connection, query
from persistence.errors import IdempotencyConflict, LeaseLost
from persistence.records import Row, RunRef
from persistence.statuses import ReceiptState


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


@dataclasses.dataclass(frozen=True)
class Prior:
    """What a call's receipt says of an earlier attempt: ``done`` with its result, or ``started``
    (a sandbox command began and its outcome was never recorded)."""

    state: ReceiptState
    result: Any


async def begin_attempt(
    conn: Connection, run: RunRef, tool_call_id: str, tool_name: str, arguments: dict[str, Any]
) -> Prior | None:
    """A side-effecting call begins (one statement): the Run is fenced (LeaseLost if its lease
    is gone), and what an earlier attempt of the call left is returned, or None when there was none."""
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
    return Prior(ReceiptState(row["state"]), row["result"])


async def begin_call(
    conn: Connection, run: RunRef, tool_call_id: str, tool_name: str, arguments: dict[str, Any]
) -> Any | None:
    """``begin_attempt`` for a call whose receipt is written with its effect: its stored result, or None."""
    prior = await begin_attempt(conn, run, tool_call_id, tool_name, arguments)
    return None if prior is None else prior.result


async def store_result(
    conn: Connection, run: RunRef, tool_call_id: str, tool_name: str, arguments: dict[str, Any], result: Any
) -> None:
    await _insert(conn, run, tool_call_id, tool_name, arguments, ReceiptState.DONE, Jsonb(_canonical(result)))


async def start_command(conn: Connection, run: RunRef, tool_call_id: str, tool_name: str,
                        arguments: dict[str, Any]) -> None:
    """Record that a sandbox command is about to start (committed before it starts): a later Run
    of the Turn then knows it may have run, and never runs it again unasked."""
    await _insert(conn, run, tool_call_id, tool_name, arguments, ReceiptState.STARTED, None)


async def finish_command(conn: Connection, run: RunRef, tool_call_id: str, result: Any) -> None:
    """The outcome of a started command (the caller fences the Run in this transaction)."""
    await conn.execute(query("receipt_finish"), {"turn_id": run.turn_id, "call_id": tool_call_id,
                                                "result": Jsonb(_canonical(result))})
    metrics.count_at_commit(conn, metrics.SANDBOX_COMMANDS, outcome=metrics.sandbox_outcome(result))


async def started_commands(conn: Connection, run_id: uuid.UUID) -> list[Row]:
    """Commands of this Run's Turn that started and have no outcome: (turn_id, tool_call_id, tree_id)."""
    cur = await conn.execute(query("started_commands"), {"run_id": run_id})
    return await cur.fetchall()


async def _insert(conn: Connection, run: RunRef, tool_call_id: str, tool_name: str, arguments: dict[str, Any],
                  state: ReceiptState, result: Jsonb | None) -> None:
    await conn.execute(
        """INSERT INTO tool_receipts (turn_id, tool_call_id, tool_name, arguments, result, first_run_id, state)
           VALUES (%s, %s, %s, %s, %s, %s, %s)""",
        (run.turn_id, tool_call_id, tool_name, Jsonb(_canonical(arguments)), result, run.run_id, state),
    )
