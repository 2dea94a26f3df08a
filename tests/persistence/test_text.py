"""What PostgreSQL cannot store is told apart and replaced, and the replacement is stored; what a model
is sent again is the size it was written."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg.types.json import Jsonb

from persistence.db import Database
from persistence.text import json_text, pictured, storable, why_unstorable

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


def test_a_control_character_is_one_character_in_json_and_the_rest_stays_as_it_is() -> None:
    every_control = "".join(chr(code) for code in range(0x20)) + "\x7f"
    shown = pictured(every_control)
    assert len(json_text(shown)) == len(shown) + 2 + 3  # the quotes, and a backslash each for tab, newline, return
    assert shown[0x1b] == "\u241b" and shown[9:11] == "\t\n" and shown[13] == "\r" and shown[-1] == "\x7f"
    assert pictured("界 \U0001f600 plain") == "界 \U0001f600 plain"
    assert json_text({"k": "界\U0001f600"}) == '{"k": "界\U0001f600"}' and json.loads(json_text("界")) == "界"
