"""What PostgreSQL cannot store is told apart and replaced, and the replacement is stored."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from persistence.db import Database
from persistence.text import storable, why_unstorable

_ROUND_TRIP = "SELECT %s::text AS t, %s::jsonb #>> '{}' AS j"
UNSTORABLE = ["a\x00b", "a\ud800b", "\udfff", "x" * 10_000 + "\x00"]
STORABLE = ["", "plain", "emoji \U0001f600 and accents é", "\ufffd", "a\\u0000b"]


@pytest.mark.parametrize("text", UNSTORABLE)
async def test_unstorable_text_is_told_and_its_replacement_is_stored(db: Database, text: str) -> None:
    assert why_unstorable(text) is not None
    replaced = storable(text)
    assert why_unstorable(replaced) is None and len(replaced) == len(text)
    async with db.tx() as conn:
        cur = await conn.execute(_ROUND_TRIP, (replaced, Jsonb(replaced)))
        assert await cur.fetchone() == {"t": replaced, "j": replaced}
    with pytest.raises((psycopg.DataError, UnicodeEncodeError)):  # why it is replaced
        async with db.tx() as conn:
            await conn.execute(_ROUND_TRIP, (text, Jsonb(text)))


@pytest.mark.parametrize("text", STORABLE)
def test_storable_text_is_kept_as_it_is(text: str) -> None:
    assert why_unstorable(text) is None and storable(text) == text
