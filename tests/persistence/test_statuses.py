"""The status and kind enums equal the schema's CHECK lists, and psycopg writes them as their values."""

from __future__ import annotations

import enum
import itertools
import re
from pathlib import Path

import pytest

from persistence import statuses
from persistence.db import Database
from persistence.sessions import activity
from persistence.statuses import (
    OPEN_TURN_STATUSES,
    TERMINAL_TURN_STATUSES,
    Activity,
    InputStatus,
    MessageKind,
    ReceiptState,
    RequestKind,
    RequestStatus,
    RunKind,
    RunStatus,
    TurnStatus,
    WaitingFor,
    WaitKind,
    WaitStatus,
)

SCHEMA = Path(statuses.__file__).with_name("schema.sql").read_text()

COLUMN_OF: dict[type[enum.StrEnum], tuple[str, str]] = {
    InputStatus: ("inputs", "status"),
    TurnStatus: ("turns", "status"),
    WaitingFor: ("turns", "waiting_for"),
    RunStatus: ("runs", "status"),
    RunKind: ("runs", "kind"),
    MessageKind: ("coop_messages", "kind"),
    WaitKind: ("waits", "kind"),
    WaitStatus: ("waits", "status"),
    ReceiptState: ("tool_receipts", "state"),
    RequestKind: ("requests", "kind"),
    RequestStatus: ("requests", "status"),
}
# sandbox_leases.state is compared only by the sandbox lease code, which spells its states itself.
WITHOUT_ENUM = {("sandbox_leases", "state")}


def _values(listed: str) -> frozenset[str]:
    return frozenset(re.findall(r"'([^']*)'", listed))


def _check_lists() -> dict[tuple[str, str], frozenset[str]]:
    """Every ``CHECK (column IN (...))`` of schema.sql, by (table, column)."""
    lists = {}
    for table, body in re.findall(r"^CREATE TABLE (\w+) \((.*?)^\);", SCHEMA, re.MULTILINE | re.DOTALL):
        for column, listed in re.findall(r"CHECK \((\w+) IN \(([^)]*)\)\)", body):
            lists[(table, column)] = _values(listed)
    return lists


@pytest.mark.parametrize("kind", list(COLUMN_OF), ids=lambda kind: kind.__name__)
def test_enum_equals_its_check_list(kind: type[enum.StrEnum]) -> None:
    assert frozenset(kind) == _check_lists()[COLUMN_OF[kind]]


def test_every_status_or_kind_column_has_an_enum() -> None:
    columns = {key for key in _check_lists() if key[1] in ("status", "kind", "state", "waiting_for")}
    assert columns - WITHOUT_ENUM == set(COLUMN_OF.values())


def test_open_turn_statuses_are_the_one_open_turn_index() -> None:
    index = re.search(r"CREATE UNIQUE INDEX turns_one_open_per_session ON turns \(session_id\)\s+"
                      r"WHERE status IN \(([^)]*)\)", SCHEMA)
    assert index is not None
    assert OPEN_TURN_STATUSES == _values(index.group(1))
    assert TERMINAL_TURN_STATUSES == frozenset(TurnStatus) - OPEN_TURN_STATUSES


def test_every_member_state_has_an_activity_and_every_activity_a_state() -> None:
    """Member states as the schema allows them (waiting_for is set exactly while the Turn waits),
    with the plain strings a row holds."""
    reached = set()
    for turn, run, pending, paused in itertools.product([None, *TurnStatus], [None, *RunStatus], [0, 2],
                                                        [False, True]):
        for waiting_for in WaitingFor if turn == TurnStatus.WAITING else [None]:
            found = activity({"turn_status": turn and str(turn), "waiting_for": waiting_for and str(waiting_for),
                              "run_status": run and str(run), "pending_inputs": pending, "queue_paused": paused})
            assert isinstance(found, Activity)
            reached.add(found)
    assert reached == set(Activity)


async def test_psycopg_writes_a_member_as_its_value(db: Database) -> None:
    """A member's name (RUNNING) would break the CHECK: the row holds its value, text or binary."""
    async with db.tx() as conn:
        await conn.execute("CREATE TEMP TABLE statuses (status text CHECK (status IN ('running', 'open')))")
        await conn.execute("INSERT INTO statuses VALUES (%s), (%b)", (TurnStatus.RUNNING, WaitStatus.OPEN))
        cur = await conn.execute("SELECT status FROM statuses WHERE status = %s OR status = %b",
                                 (RunStatus.RUNNING, WaitStatus.OPEN))
        rows = await cur.fetchall()
    assert sorted(row["status"] for row in rows) == ["open", "running"]
