"""Where settings come from: ``CANOPY_*`` variables, ``DATABASE_URL`` for the database URL, a
``.env`` file in the current directory (the environment wins), and secret files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from persistence.settings import Settings, reveal, secret_env_names


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Canopy variable of the test session, and a current directory of the test's own."""
    for name in ("CANOPY_DATABASE_URL", "DATABASE_URL", "CANOPY_TREE_SLOTS", "CANOPY_SECRETS_DIR",
                 "CANOPY_SESSION_SPREAD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_database_url_is_an_alias_and_the_canopy_name_wins(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://alias/db")
    assert reveal(Settings().database_url) == "postgresql://alias/db"
    monkeypatch.setenv("CANOPY_DATABASE_URL", "postgresql://canopy/db")
    assert reveal(Settings().database_url) == "postgresql://canopy/db"
    assert reveal(Settings(database_url="postgresql://argument/db").database_url) == "postgresql://argument/db"


def test_a_dotenv_file_is_read_and_the_environment_wins(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (clean / ".env").write_text("DATABASE_URL=postgresql://dotenv/db\nCANOPY_TREE_SLOTS=7\nSOMETHING_ELSE=1\n")
    settings = Settings()
    assert (reveal(settings.database_url), settings.tree_slots) == ("postgresql://dotenv/db", 7)
    monkeypatch.setenv("CANOPY_TREE_SLOTS", "9")
    assert Settings().tree_slots == 9


def test_secret_files_still_count_after_the_environment(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (clean / "secrets").mkdir()
    (clean / "secrets" / "canopy_database_url").write_text("postgresql://file/db")
    monkeypatch.setenv("CANOPY_SECRETS_DIR", str(clean / "secrets"))
    assert reveal(Settings().database_url) == "postgresql://file/db"
    monkeypatch.setenv("DATABASE_URL", "postgresql://env/db")
    assert reveal(Settings().database_url) == "postgresql://env/db"


def test_the_alias_is_a_secret_variable_too() -> None:
    # Canopy takes secret variables out of the environment its Ray processes inherit.
    assert {"CANOPY_DATABASE_URL", "DATABASE_URL", "CANOPY_ADMIN_TOKEN"} <= secret_env_names()


def test_session_spread_is_pack_unless_set_and_refuses_anything_else(clean: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().session_spread == "pack"
    monkeypatch.setenv("CANOPY_SESSION_SPREAD", "spread")
    assert Settings().session_spread == "spread"
    monkeypatch.setenv("CANOPY_SESSION_SPREAD", "everywhere")
    with pytest.raises(ValidationError, match="session_spread"):
        Settings()
