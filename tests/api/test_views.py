"""What the ``canopy`` commands print of what a model or a tenant wrote: text, never markup or a
terminal's control sequence."""

from __future__ import annotations

import datetime
import io
import uuid

from rich.console import Console

from api.views import agents_table, sessions_table, tree_table

# A hyperlink in rich's markup, a clipboard write (OSC 52), a screen clear and a carriage return
# that would print over the line.
HOSTILE = "[link=https://evil.example]open[/link] \x1b]52;c;ZXZpbA==\x1b\\ \x1b[2J\rok"


def _printed(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=400).print(renderable)
    return out.getvalue()


def test_titles_and_names_print_as_text() -> None:
    now = datetime.datetime.now(datetime.UTC)
    member = {"depth": 0, "name": "root", "activity": "idle", "turn_status": "completed", "pending_inputs": 0,
              "title": HOSTILE}
    tree = {"tree_id": uuid.uuid4(), "slots_in_use": 0, "slot_limit": 4, "members": [member]}
    agent = {"agent_id": "a", "name": HOSTILE, "model": "m", "approval_mode": "auto", "shared": True,
             "owner_user_id": "u"}
    session = {"session_id": uuid.uuid4(), "activity": "idle", "turn_status": None, "created_at": now,
               "title": HOSTILE}
    for table in (tree_table(tree), agents_table([agent]), sessions_table([session])):
        printed = _printed(table)
        assert "\x1b]" not in printed and "\x1b[2J" not in printed and "\r" not in printed, repr(printed)
        assert "[link=https://evil.example]open[/link]" in printed
        assert "⟨U+001B⟩]52;c;ZXZpbA==⟨U+001B⟩\\" in printed and "⟨U+000D⟩ok" in printed
