"""Where settings come from: ``CANOPY_*`` variables, ``DATABASE_URL`` for the database URL, a
``.env`` file in the current directory (the environment wins), and secret files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from persistence.settings import Settings, reveal, secret_env_names


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Canopy variable of the test session, and a current directory of the test's own."""
    for name in ("CANOPY_DATABASE_URL", "DATABASE_URL", "CANOPY_TREE_SLOTS", "CANOPY_SECRETS_DIR",
                 "CANOPY_SESSION_SPREAD", "CANOPY_RAY_ADDRESS", "CANOPY_MODELS_FILE", "CANOPY_ADMIN_TOKEN",
                 "CANOPY_METRICS_TOKEN", "CANOPY_OTEL_EXPORTER", "CANOPY_LEASE_SECONDS", "CANOPY_HEARTBEAT_SECONDS",
                 "CANOPY_SWEEP_SECONDS", "CANOPY_SCRIPTED_MODEL_PORT", "CANOPY_DB_STATEMENT_TIMEOUT_SECONDS",
                 "CANOPY_DB_LOCK_TIMEOUT_SECONDS"):
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


OPTIONAL_VARIABLES = ("CANOPY_DATABASE_URL", "DATABASE_URL", "CANOPY_SECRETS_DIR", "CANOPY_RAY_ADDRESS",
                      "CANOPY_MODELS_FILE", "CANOPY_ADMIN_TOKEN", "CANOPY_METRICS_TOKEN", "CANOPY_OTEL_EXPORTER")


def test_an_empty_variable_is_an_unset_one(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CANOPY_RAY_ADDRESS=`` was an address "" (checked with ``is None`` in some places, as falsy in
    others: canopy up started a local Ray as if it were joining one), ``CANOPY_MODELS_FILE=`` the
    current directory, ``CANOPY_ADMIN_TOKEN=`` a token "" ."""
    for name in OPTIONAL_VARIABLES:
        monkeypatch.setenv(name, "")
    settings = Settings()
    assert [getattr(settings, name) for name in ("database_url", "secrets_dir", "ray_address", "models_file",
                                                 "admin_token", "metrics_token", "otel_exporter")] == [None] * 7
    # Not even in an argument or a secret file: "" is no value of an optional setting.
    assert Settings(ray_address="", models_file="", admin_token="").ray_address is None
    (clean / "secrets").mkdir()
    (clean / "secrets" / "canopy_database_url").write_text("")
    monkeypatch.setenv("CANOPY_SECRETS_DIR", str(clean / "secrets"))
    assert Settings().database_url is None
    # An empty variable hides no file: the file's value counts, as when the variable is unset.
    (clean / "secrets" / "canopy_database_url").write_text("postgresql://file/db")
    assert reveal(Settings().database_url) == "postgresql://file/db"


@pytest.mark.parametrize("variable", ["CANOPY_ADMIN_TOKEN", "CANOPY_METRICS_TOKEN"])
def test_a_token_shorter_than_16_characters_is_refused(clean: Path, monkeypatch: pytest.MonkeyPatch,
                                                       variable: str) -> None:
    monkeypatch.setenv(variable, "short-token")
    with pytest.raises(ValidationError, match="at least 16 characters") as refused:
        Settings()
    assert "short-token" not in str(refused.value)
    monkeypatch.setenv(variable, "a-token-of-16-ch")
    assert reveal(getattr(Settings(), variable.removeprefix("CANOPY_").lower())) == "a-token-of-16-ch"


@pytest.mark.parametrize(("variables", "says"), [
    ({"CANOPY_LEASE_SECONDS": "4", "CANOPY_HEARTBEAT_SECONDS": "3"},
     "CANOPY_HEARTBEAT_SECONDS (3.0) must be at most half of CANOPY_LEASE_SECONDS (4.0)"),
    ({"CANOPY_LEASE_SECONDS": "inf"}, "finite number"),
    ({"CANOPY_SWEEP_SECONDS": "nan"}, "finite number"),
    ({"CANOPY_SWEEP_SECONDS": "0.001"}, "greater than or equal to 0.05"),
    ({"CANOPY_SCRIPTED_MODEL_PORT": "70000"}, "less than or equal to 65535"),
    ({"CANOPY_SCRIPTED_MODEL_PORT": "-1"}, "greater than or equal to 0"),
    ({"CANOPY_DB_STATEMENT_TIMEOUT_SECONDS": "3000000"}, "less than or equal to 2147483.647"),
    ({"CANOPY_DB_LOCK_TIMEOUT_SECONDS": "3000000"}, "less than or equal to 2147483.647"),
    *(({f"CANOPY_{name}_SECONDS": "1e13"}, "less than or equal to 31622400") for name in (
        "ACTOR_IDLE", "HOST_DRAIN", "LEASE", "SWEEP", "NODE_WATCH", "SANDBOX_IDLE", "MODEL_TIMEOUT")),
    ({"CANOPY_LEASE_SECONDS": "1e13", "CANOPY_HEARTBEAT_SECONDS": "1e13"}, "less than or equal to 31622400"),
    *(({"CANOPY_SANDBOX_MEMORY": size}, "a sandbox needs at least 6 MiB of memory") for size in ("0", "0g", "5m")),
    *(({"CANOPY_FAILPOINTS": spec}, "String should match pattern") for spec in (
        "after_model_commit=nan", "after_model_commit=inf", "after_model_commit=-1", "after_model_commit=soon")),
])
def test_a_setting_that_cannot_work_is_refused(clean: Path, monkeypatch: pytest.MonkeyPatch,
                                               variables: dict[str, str], says: str) -> None:
    """Each was accepted: a heartbeat as long as the lease (every Run recovered while it runs),
    an infinite lease, a sweep every millisecond, a port no socket has, a timeout PostgreSQL refuses
    (its milliseconds are an int) on every pooled connection, a duration past PostgreSQL's intervals
    (~9.2e12 s: every grant, or every sweep's idle release, failed)."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=re.escape(says)):
        Settings()


def test_the_test_suites_runtime_settings_are_valid(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import RUNTIME_ENV

    for name, value in RUNTIME_ENV.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert (settings.lease_seconds, settings.heartbeat_seconds, settings.sweep_seconds) == (4, 1, 0.5)
