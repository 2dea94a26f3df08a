"""The README's settings table is the Settings class: every setting, its default and what it does.

    python -m tests.test_readme --write   # rewrites the table in README.md from persistence/settings.py
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from persistence.settings import ENV_PREFIX, Settings

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- settings table: generated from persistence/settings.py -->", "<!-- end of settings table -->"


def _cell(text: str) -> str:
    """One line of Markdown table cell: a pipe would end the cell, an angle bracket start an HTML tag."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "\\<")


def _default(field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, list):
        return ", ".join(f"`{item}`" for item in value)
    if isinstance(value, Path):  # a default under the home directory reads the same on every machine
        value = str(value).replace(str(Path.home()), "~", 1)
    return f"`{value}`"


def settings_table() -> str:
    """The Markdown table of every setting: its variable, its default and its description."""
    rows = ["| Variable | Default | Description |", "|---|---|---|"]
    rows += [f"| `{ENV_PREFIX}{name.upper()}` | {_cell(_default(field))} | {_cell(field.description or '')} |"
             for name, field in Settings.model_fields.items()]
    return "\n".join(rows)


def _split(text: str) -> tuple[str, str, str]:
    """The README before the table (its start marker included), the table, and the rest."""
    start, end = text.index(START) + len(START), text.index(END)
    return text[:start], text[start:end].strip(), text[end:]


def test_every_setting_has_a_description() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    assert missing == [], f"settings without a description: {missing}"


def test_the_readme_table_is_the_settings_class() -> None:
    table = _split(README.read_text())[1]
    assert f"| `{ENV_PREFIX}TREE_SLOTS` | `4` |" in settings_table()  # rendered from the class, not empty
    assert table == settings_table(), "the README's settings table is stale: run python -m tests.test_readme --write"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Check or rewrite README.md's settings table.")
    parser.add_argument("--write", action="store_true", help="rewrite the table from persistence/settings.py")
    if parser.parse_args().write:
        before, _, after = _split(README.read_text())
        README.write_text(f"{before}\n{settings_table()}\n{after}")
    else:
        raise SystemExit(0 if _split(README.read_text())[1] == settings_table() else "the settings table is stale")
