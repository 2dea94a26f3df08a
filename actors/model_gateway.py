"""ModelGateway: the only place that imports litellm (SPEC §10, §13).

The class is plain so that tests can use it directly; the runtime wraps it as an async Ray
actor, one per node (``canopy:gateway:<node id>``, actors/gateways.py). Every method is a
coroutine so that, as an actor, all calls share one event loop with the embedded scripted model.

Every call goes through one litellm ``Router``: it retries with exponential backoff and
jitter (or after the provider's ``Retry-After``), falls back along ``fallbacks``, holds
calls back at a deployment's ``rpm``/``tpm`` and applies timeouts. Its routes come from the
models file (``CANOPY_MODELS_FILE``: litellm's own ``model_list`` and ``router_settings``),
which is reloaded when it changes; every other model string goes to its provider as is. An
agent's own ``api_base``/``api_key_ref`` make a route of their own (retries and timeouts
apply, the file's fallbacks do not: they belong to the file's model names).

Keys: the provider variables (``CANOPY_PROVIDER_ENV``) reach this process as files of the
secrets directory (actors/runtime.py moves them there) and are put into this process's
environment only, where litellm looks for them. An ``api_key_ref`` names one of them or
another file of that directory; the key is resolved here, at call time, and never logged.

litellm is imported on first use: it costs seconds and hundreds of MB, and only the
gateway process should pay that, not every module that imports this one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import decimal
import fnmatch
import functools
import hashlib
import json
import logging
import math
import os
import re
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, overload

import yaml

from persistence.agents import API_KEY_REF_PATTERN
from persistence.settings import DURATION_MAX_SECONDS, MODEL_RETRIES_MAX
from persistence.text import json_text, storable, why_unstorable

if TYPE_CHECKING:
    from actors import bounded_http
    from actors.scripted.server import ScriptedModelServer

log = logging.getLogger(__name__)

SCRIPTED_PREFIX = "canopy/"
# The scripted endpoint ignores the key, but litellm's OpenAI client insists on one.
SCRIPTED_API_KEY = "canopy-scripted"
# What an agent's own api_base gets when the agent names no key: never one of the operator's.
NO_KEY = "canopy-no-key"
# Routes every configuration has: the scripted model (its endpoint is given per call: it is
# started on first use) and, unless the models file has its own, any other model string as is.
_SCRIPTED_ROUTE = {"model_name": SCRIPTED_PREFIX + "*", "litellm_params": {"model": "openai/*",
                                                                            "api_key": SCRIPTED_API_KEY}}
_PASS_THROUGH = {"model_name": "*", "litellm_params": {"model": "*"}}
_ENV_REFERENCE = "os.environ/"
_MODELS_FILE_KEYS = ("model_list", "router_settings")
_NO_MODELS_FILE: dict[str, Any] = {"model_list": [], "router_settings": {}}
# The metadata key that ties litellm's per-attempt failure callbacks to the call they belong to.
_CALL_KEY = "canopy_call"
_ERROR_CHARS = 1000
# The only key of a tool call's arguments that were not a JSON object nested at most
# MAX_ARGUMENT_DEPTH deep whose strings can be stored; its value is the raw text (actors/toolbox.py
# answers such a call with what was wrong). No tool's arguments nest deeper; a reply nested some
# 900 levels cannot be pickled, and Ray carrying it out of the gateway killed the gateway's process.
# A NUL character or a lone surrogate (persistence/text.py) fails the commit of the reply: arguments
# holding one are refused (what a tool would get in its place is not what the model asked for), the
# reply's other text gets U+FFFD instead. So do NaN, Infinity and a number past a double (inf),
# which Python's JSON parser takes and jsonb refuses. And numbers that jsonb writes out in full:
# it keeps numbers as numeric and prints them in plain decimal, so "1e308" (5 characters) comes back
# as 309, and a million characters of them as fifty million in every later model call.
INVALID_ARGUMENTS = "_invalid_arguments"
MAX_ARGUMENT_DEPTH = 32
# How many characters all of one call's numbers may grow by, written out as jsonb gives them back.
NUMBER_GROWTH_CHARS = 10_000
# What OpenAI and Anthropic accept as a tool's name (and Anthropic as a call's id) in a request's
# history: a model's "functions.run_command" or a server's "call:1" kept as they came would fail
# every later request of the session. A name outside it is stored as invalid_name_<the name with
# "_" for what is not allowed>, which no tool has; an id is stored with "_" for what is not allowed
# (actors/agent_loop.py then keeps it unique within its Turn).
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_-]")
IDENTIFIER_CHARS = 64
# More tokens than any model's window: a figure past it is not a count.
_MAX_TOKENS_PER_CALL = 100_000_000
# The most one call may cost, in USD: the dearest models charge cents to dollars per call. A provider's
# reported cost past it (or not a finite, non-negative number) is not believed: 1e308 overflowed a
# tree's sum of costs in PostgreSQL, failing every later reply of its lineage.
_MAX_COST_PER_CALL = 1000.0
# The chunks one streamed reply may send: more than any model's longest output (a chunk is a token or
# more), so a stream that never ends is cut before its chunks fill the gateway's memory.
_MAX_STREAM_CHUNKS = 200_000
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Agents' own endpoints a gateway's Router keeps as deployments. Every call of the node, of every scope,
# is routed through that Router at a cost that grows with its deployments (here ~2.6 ms more per call
# at 1,000 of them, and ~10 ms more per one added at 5,000), and whoever may create agents names a
# model string per agent. Past this the least recently used idle ones are forgotten: added again when
# called, at ~5 ms.
ENDPOINTS_KEPT = 256
_INVALID_NAME_PREFIX = "invalid_name_"


class ModelError(Exception):
    """A model call failed for good; the message carries the provider's error text, and
    ``attempts`` the requests that failed on the way (model, error, latency_ms, ended_at as
    seconds since the epoch). ``charged``: a reply the provider generated (and billed) but that
    is not kept, as the reply would have been accounted: {model, usage, cost_usd}. ``passing``:
    the call failed for a reason that passes (``passes``), its retries used up."""

    def __init__(self, message: str, attempts: Sequence[dict[str, Any]] = (),
                 charged: dict[str, Any] | None = None, passing: bool = False) -> None:
        super().__init__(message)
        self.attempts = list(attempts)
        self.charged = charged
        self.passing = passing

    def __reduce__(self) -> tuple[Any, ...]:  # crosses Ray with its attempts, charge and kind
        return type(self), (str(self), self.attempts, self.charged, self.passing)


# litellm's errors of a call that may get through when asked again later: a rate limit, a provider
# overloaded, down or unreachable (litellm's InternalServerError includes a refused connection). A
# 400, a content filter or a refused key would fail the same way again; so would a timeout of a model
# too slow for the request, and litellm's APIConnectionError, which is also its name for an error it
# cannot classify (a malformed reply).
_PASSING_ERRORS = ("RateLimitError", "InternalServerError", "ServiceUnavailableError", "BadGatewayError")


def passes(error: BaseException) -> bool:
    """Whether litellm's ``error`` is one of a call that may get through later (``_PASSING_ERRORS``):
    by its class, never by its text, which holds the provider's."""
    litellm = _litellm()
    return isinstance(error, tuple(getattr(litellm, name) for name in _PASSING_ERRORS))


# The failed attempts of the calls in flight, by call id (see _litellm's failure callback).
_failed_attempts: dict[str, list[dict[str, Any]]] = {}


@overload
def _storable(text: str) -> str: ...


@overload
def _storable(text: None) -> None: ...


def _storable(text: str | None) -> str | None:
    return None if text is None else storable(text)


def _first_line(error: BaseException | str | None) -> str:
    text = str(error or "").strip()
    return _storable(text.splitlines()[0] if text else type(error).__name__)[:_ERROR_CHARS]


@functools.cache
def _litellm() -> ModuleType:
    # Without this litellm fetches its price map from GitHub at import time (no network here).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm
    from litellm.integrations.custom_logger import CustomLogger

    # Imported with litellm: every Canopy worker loads this module (a session's process to reach the
    # gateway, whose class Ray loads for its handle) and none but the gateway's needs httpx.
    from actors import bounded_http
    from actors.scripted import MODEL_ID

    litellm.suppress_debug_info = True
    # litellm prices every reply; a model missing from its price map costs a search through the
    # whole map on each call (~8 % of a scripted call's CPU). The scripted model is free.
    # Every price is given (cache reads and writes too), or litellm warns that it assumes zero.
    litellm.register_model({"openai/" + MODEL_ID: {
        "litellm_provider": "openai", "mode": "chat", "supports_function_calling": True,
        "input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
        "cache_creation_input_token_cost": 0.0, "cache_read_input_token_cost": 0.0}})

    class FailedAttempts(CustomLogger):  # type: ignore[misc]
        """Every request the Router made that failed (a retry or a fallback follows, or the call fails)."""

        async def async_log_failure_event(self, kwargs: dict[str, Any], response_obj: Any,
                                          start_time: Any, end_time: Any) -> None:
            metadata = (kwargs.get("litellm_params") or {}).get("metadata") or {}
            attempts = _failed_attempts.get(metadata.get(_CALL_KEY, ""))
            if attempts is not None:
                seconds = (end_time - start_time).total_seconds() if end_time and start_time else 0.0
                attempts.append({"group": metadata.get("model_group") or kwargs.get("model"),
                                 "error": _first_line(kwargs.get("exception")), "latency_ms": seconds * 1000,
                                 "ended_at": time.time()})

    litellm.callbacks.append(FailedAttempts())
    litellm.aclient_session = bounded_http.client()  # an endpoint's answer is read only so far
    return litellm


# ---------------------------------------------------------------------------
# Request / response shapes
# ---------------------------------------------------------------------------


def _openai_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    if "function" in call:
        return call
    # Canopy's own shape (what complete() returns): fed back into the next request as is.
    arguments = call.get("arguments", {})
    return {
        "id": call["id"],
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": arguments if isinstance(arguments, str) else json_text(arguments),
        },
    }


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    message = dict(message)
    if message.get("tool_calls"):
        message["tool_calls"] = [_openai_tool_call(c) for c in message["tool_calls"]]
    elif "tool_calls" in message:
        del message["tool_calls"]  # providers reject an empty tool_calls list
    if message.get("role") == "tool" and not isinstance(message.get("content"), str):
        message["content"] = json_text(message.get("content"))
    return message


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accept assistant tool calls both in OpenAI shape and in the shape complete() returns."""
    return [_openai_message(m) for m in messages]


def to_openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accept tools both as OpenAI ``{"type": "function", "function": ...}`` and as bare functions."""
    return [t if "function" in t else {"type": "function", "function": t} for t in tools]


def _acceptable(value: Any, limit: int) -> bool:
    """Whether lists and objects nest in ``value`` at most ``limit`` deep and every string in it (key
    or value) can be stored (without recursing)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if why_unstorable(item) is not None:
                return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, dict | list):
            if depth > limit:
                return False
            children = [*item, *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _plain_decimal_chars(value: float) -> int:
    """How long jsonb writes ``value`` (finite) out: plain decimal, as many digits as its repr."""
    sign, digits, exponent = decimal.Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    if exponent >= 0:
        return sign + len(digits) + exponent
    return sign + (len(digits) + 1 if len(digits) > -exponent else 2 - exponent)  # "0." and zeros first


def _float_parser() -> Callable[[str], float]:
    """A ``parse_float`` for one call's arguments that refuses them (ValueError) once its numbers
    grow by more than NUMBER_GROWTH_CHARS written out in full."""
    grown = 0

    def parse(literal: str) -> float:
        nonlocal grown
        value = float(literal)
        if math.isfinite(value):  # not finite: refused by _acceptable
            grown += max(_plain_decimal_chars(value) - len(literal), 0)
            if grown > NUMBER_GROWTH_CHARS:
                raise ValueError("numbers too long written out")
        return value

    return parse


def _arguments(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}", parse_float=_float_parser())
    except (ValueError, RecursionError):  # nested deeper than the parser recurses: broken or hostile
        value = None
    if isinstance(value, dict) and _acceptable(value, MAX_ARGUMENT_DEPTH):
        return value
    # Kept visible rather than dropped so the tool layer can tell the model what was wrong.
    return {INVALID_ARGUMENTS: _storable(raw)}


def _identifier(text: Any) -> str:
    """``text`` with every character outside ``[A-Za-z0-9_-]`` as ``_``, at most 64 of them."""
    return _NOT_IDENTIFIER.sub("_", text if isinstance(text, str) else "")[:IDENTIFIER_CHARS]


def _tool_name(name: Any) -> str:
    """A called tool's name as a request's history can carry it. Never the name of a tool when the
    model did not write one exactly: such a call is answered as unknown, not run."""
    if isinstance(name, str) and _identifier(name) == name and name:
        return name
    return (_INVALID_NAME_PREFIX + _identifier(name))[:IDENTIFIER_CHARS]


def _function(call: Any) -> tuple[Any, Any]:
    """A tool call's name and raw arguments; a call of another type than ``function`` (``custom``) has
    neither, and is answered as a call of an unknown tool."""
    function = getattr(call, "function", None)
    return getattr(function, "name", None), getattr(function, "arguments", None)


def _chars(*texts: Any) -> int:
    return sum(len(text) for text in texts if isinstance(text, str))


def _reply_chars(message: Any) -> int:
    """The characters of a reply's text and of its tool calls' ids, names and arguments."""
    return _chars(getattr(message, "content", None)) + sum(
        _chars(getattr(call, "id", None), *_function(call)) for call in getattr(message, "tool_calls", None) or [])


def _message(response: Any) -> dict[str, Any]:
    message = response.choices[0].message
    tool_calls = [
        {"id": _identifier(call.id), "name": _tool_name(name), "arguments": _arguments(arguments)}
        for call in (message.tool_calls or []) for name, arguments in [_function(call)]
    ]
    return {"role": "assistant", "content": _storable(message.content), "tool_calls": tool_calls}


def _usage(response: Any) -> dict[str, int]:
    usage = getattr(response, "usage", None)
    return {
        "prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
        "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0),
    }


def _plausible_tokens(figure: Any) -> bool:
    return isinstance(figure, int) and not isinstance(figure, bool) and 0 <= figure <= _MAX_TOKENS_PER_CALL


def _usage_reported(response: Any) -> bool:
    """Whether the provider reported counts the reply can be charged by. A real request always has
    prompt tokens, so zeros are a provider that reported nothing; a negative count would lower the
    tree's usage past its budgets, and one past bigint would fail the reply's commit."""
    usage = getattr(response, "usage", None)
    figures = [getattr(usage, name, 0) or 0 for name in ("prompt_tokens", "completion_tokens")]
    return usage is not None and all(map(_plausible_tokens, figures)) and any(figures)


def _estimate_usage(litellm: ModuleType, response: Any, messages: list[dict[str, Any]], model: str) -> None:
    """Give a reply whose provider reported no usage (some OpenAI-compatible servers do not) litellm's
    estimate, as litellm's stream builder does for a stream without a usage chunk: budgets count
    tokens, and a provider must not spend a tree's without counting."""
    message = response.choices[0].message
    completion = (message.content or "") + "".join(
        arguments if isinstance(arguments := _function(call)[1], str) else "" for call in message.tool_calls or [])
    prompt_tokens = int(litellm.token_counter(model=model, messages=messages))
    completion_tokens = int(litellm.token_counter(model=model, text=completion, count_response_tokens=True))
    _estimated(litellm, response, prompt_tokens, completion_tokens)


def _estimated(litellm: ModuleType, response: Any, prompt_tokens: int, completion_tokens: int) -> None:
    response.usage = litellm.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                   total_tokens=prompt_tokens + completion_tokens)


def _plausible_cost(figure: Any) -> bool:
    # The range first: isfinite of an int past a double's range raises OverflowError.
    return (isinstance(figure, int | float) and not isinstance(figure, bool) and 0 <= figure <= _MAX_COST_PER_CALL
            and math.isfinite(figure))


def _cost(litellm: ModuleType, response: Any, priced: Any, models: Sequence[str]) -> float | None:
    """The reply's price: ``priced`` when litellm priced the call already (a whole reply; a stream's
    figure comes before its usage chunk), else priced from the response; a figure no call can cost
    (a provider's reported ``usage.cost`` of 1e308) is priced from the reply's tokens instead.
    ``models``: the answering deployment's id and its provider model string. A figure of 0 is
    priced again from their rates: litellm prices 0 a call of a model it has no price for (an agent's
    own endpoint's, say: None, not a free call, but one a cost budget cannot count, see
    canopy_budget_reached), and a streamed call of a deployment the models file prices (it looks the
    reply's own model up, not the deployment)."""
    figure = priced
    if not _plausible_cost(figure):
        try:
            figure = litellm.completion_cost(completion_response=response)
            if not _plausible_cost(figure):
                figure = sum(litellm.cost_per_token(model=response.model or models[-1], **_usage(response)))
        except Exception:  # unknown models have no price; accounting must not fail the call
            figure = 0.0
    if figure == 0:
        rates = _rates(litellm, models)
        if rates is None:
            return None
        usage = _usage(response)
        figure = usage["prompt_tokens"] * rates[0] + usage["completion_tokens"] * rates[1]
    return float(figure) if _plausible_cost(figure) else None


def _rates(litellm: ModuleType, models: Sequence[str]) -> tuple[float, float] | None:
    """The price per token, in and out, that litellm's price map or the models file gives the first
    of ``models`` it prices; None when none is priced (the Router enters every deployment's model in
    the map, priced or not)."""
    for name in models:
        entry = litellm.model_cost.get(name) or {}
        rate_in, rate_out = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        if rate_in is not None or rate_out is not None:
            return float(rate_in or 0), float(rate_out or 0)
    return None


# ---------------------------------------------------------------------------
# Keys and routes
# ---------------------------------------------------------------------------


def _file_stamp(path: Path | None) -> tuple[int, int, int] | None:
    try:
        found = path.stat() if path is not None else None
    except FileNotFoundError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino) if found is not None else None


def _endpoint(url: str) -> tuple[str, str, int, str] | None:
    """The scheme, host, port and path (without a final "/") an http(s) URL reaches; None for one
    whose host a reader could take differently (credentials before it, none, a port that is not one),
    or whose path is not what it reaches: the HTTP client resolves dot segments, plain or
    percent-encoded, before it sends (``/v1/../admin`` is ``/admin``), and a query or a fragment
    would cut off the path litellm appends to a base."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    if "?" in url or "#" in url or {".", ".."} & {urllib.parse.unquote(s) for s in parts.path.split("/")}:
        return None
    return scheme, parts.hostname, port or _DEFAULT_PORTS[scheme], parts.path.rstrip("/")


# litellm's chat providers whose calls without an api_base go to a server on the calling machine (their
# handlers' defaults: ollama localhost:11434, llamafile 127.0.0.1:8080, ...) unless the variable named
# here, the operator's, says where.
_LOCAL_PROVIDERS = {"ollama": "OLLAMA_API_BASE", "ollama_chat": "OLLAMA_API_BASE", "llamafile": "LLAMAFILE_API_BASE",
                    "lemonade": "LEMONADE_API_BASE", "docker_model_runner": "DOCKER_MODEL_RUNNER_API_BASE",
                    "langgraph": "LANGGRAPH_API_BASE", "langflow": "LANGFLOW_API_BASE"}


def _local_default(litellm: ModuleType, model: str, keys: _Keys) -> str | None:
    """Where a call of ``model`` without an api_base goes when that is a server on this machine by
    litellm's default, not by the operator's word; None otherwise (or with no provider: the
    environment check says so)."""
    try:
        _, provider, _, base = litellm.get_llm_provider(model=model)
    except Exception:
        return None
    variable = _LOCAL_PROVIDERS.get(provider)
    if variable is None or keys.value(variable):
        return None
    return f"{base or 'a server on this machine'} (unless {variable} says where)"


_Entry = tuple[tuple[str, str, int, str] | None, frozenset[str] | None]


def _entries(listed: Sequence[str] | Mapping[str, Sequence[str]]) -> tuple[_Entry, ...]:
    """The endpoints agents may use, each with the key names they may send there (None: any)."""
    if isinstance(listed, Mapping):
        return tuple((_endpoint(url), frozenset(keys)) for url, keys in listed.items())
    return tuple((_endpoint(url), None) for url in listed)


def _allowed_keys(api_base: str, allowed: Sequence[_Entry]) -> list[frozenset[str] | None]:
    """The key names of each of the ``allowed`` endpoints (as ``_endpoint`` reads them) that
    ``api_base`` is, or is under: compared by scheme, host, port and whole path segments, as the HTTP
    client will read it. A text prefix would let ``http://box:8000@elsewhere`` or
    ``http://box.elsewhere`` through. Empty: no endpoint agents may use."""
    endpoint = _endpoint(api_base)
    if endpoint is None:
        return []
    scheme, host, port, path = endpoint
    return [keys for entry, keys in allowed if entry is not None and entry[:3] == (scheme, host, port)
            and (path == entry[3] or path.startswith(entry[3] + "/"))]


class _Keys:
    """Keys and endpoints from this process's environment and the secrets directory."""

    def __init__(self, secrets_dir: Path | None, provider_env: Sequence[str]) -> None:
        self.secrets_dir = secrets_dir
        self.provider_env = frozenset(provider_env)
        self._loaded: set[str] = set()

    def stamp(self) -> tuple[int, int, int] | None:
        """Changes whenever a secret file is written, replaced or removed."""
        return _file_stamp(self.secrets_dir)

    def _file(self, name: str) -> str | None:
        if self.secrets_dir is None:
            return None
        try:
            return (self.secrets_dir / name).read_text().rstrip("\r\n")
        except (FileNotFoundError, IsADirectoryError):
            return None

    def load_provider_env(self) -> None:
        """The provider variables of the secrets directory into this process's environment, where
        litellm reads them (a variable whose file went away leaves it again)."""
        for name in sorted(self.provider_env):
            value = self._file(name)
            if value is not None:
                os.environ[name] = value
                self._loaded.add(name)
            elif name in self._loaded:
                os.environ.pop(name, None)
                self._loaded.discard(name)

    def value(self, name: str) -> str | None:
        """Any variable or secret file (the models file is the operator's own word)."""
        return os.environ.get(name) or self._file(name)

    def agent_key(self, name: str) -> str:
        """The key an agent's ``api_key_ref`` names: a file of the secrets directory, or a provider
        variable. Nothing else of this process's environment is an agent's to send anywhere."""
        if not re.fullmatch(API_KEY_REF_PATTERN, name) or name.startswith("CANOPY_"):
            raise ModelError(f"api_key_ref {name!r} is not the name of a provider key (upper-case letters, digits "
                             "and '_', not a CANOPY_ setting)")
        value = self._file(name) or (os.environ.get(name) if name in self.provider_env else None)
        if not value:
            raise ModelError(
                f"api_key_ref {name!r} names no key the model gateway has: set {name} in the environment Canopy "
                f"starts from and list it in CANOPY_PROVIDER_ENV, or put it in a file {name} of the secrets "
                "directory")
        return value


# The router_settings a call's deadline is made of (null or unset: Canopy's settings).
_DEADLINE_SETTINGS = ("timeout", "num_retries")
# The numbers of a models file that become timers of the gateway's loop, or a count of attempts, in
# router_settings (and its default_litellm_params) and in a deployment's litellm_params: a NaN there
# broke the loop's timers, those of every call on the node, and a negative one cut every call off at
# once (null or unset: the default).
_SECONDS_ABOVE_0 = ("timeout", "stream_timeout", "request_timeout")
_SECONDS_FROM_0 = ("retry_after", "cooldown_time")
_ATTEMPTS = ("num_retries", "max_retries")


def _numbers_problem(where: str, settings: dict[str, Any], *, text: bool = False) -> str | None:
    """What is wrong with the timers and attempts of ``settings`` (``where`` in the file). ``text``:
    litellm parses these of a deployment from text too ("30"; ``os.environ/NAME`` is read first,
    ``_Routes._resolved``)."""
    for key in (*_SECONDS_ABOVE_0, *_SECONDS_FROM_0, *_ATTEMPTS):
        value = settings.get(key)
        if value is None:
            continue
        if text and isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value) if key in _ATTEMPTS else float(value)
        if key in _ATTEMPTS:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MODEL_RETRIES_MAX:
                return f"{where}.{key} must be a whole number from 0 to {MODEL_RETRIES_MAX}"
        elif isinstance(value, bool) or not isinstance(value, int | float) or not (
                0 <= value <= DURATION_MAX_SECONDS and (value > 0 or key in _SECONDS_FROM_0)):
            bounds = "from 0 to" if key in _SECONDS_FROM_0 else "above 0, at most"
            return f"{where}.{key} must be a number of seconds {bounds} {DURATION_MAX_SECONDS:,}"
    return None


def _models_file_problem(config: Any) -> str | None:
    """What is wrong with a models file's contents for litellm's Router and the gateway's loop (a
    deployment's numbers are checked once its ``os.environ/NAME`` values are read, ``_Routes._resolved``)."""
    if not isinstance(config, dict):
        return "it must be a mapping with model_list and router_settings"
    if unknown := sorted(set(config) - set(_MODELS_FILE_KEYS)):
        return f"unknown key(s) {', '.join(map(str, unknown))}: it takes {' and '.join(_MODELS_FILE_KEYS)}"
    model_list, router_settings = config.get("model_list", []), config.get("router_settings", {})
    if not isinstance(model_list, list) or not all(
            isinstance(d, dict) and isinstance(d.get("model_name"), str) and isinstance(d.get("litellm_params"), dict)
            and isinstance(d["litellm_params"].get("model"), str) for d in model_list):
        return "each model_list entry needs a model_name and litellm_params with a model"
    if not isinstance(router_settings, dict):
        return "router_settings must be a mapping"
    defaults = router_settings.get("default_litellm_params") or {}
    if not isinstance(defaults, dict):
        return "router_settings.default_litellm_params must be a mapping"
    return (_numbers_problem("router_settings", router_settings)
            or _numbers_problem("router_settings.default_litellm_params", defaults, text=True))


def _read_models_file(path: Path) -> dict[str, Any]:
    """The models file, checked for the shape litellm's Router takes; ModelError naming the file."""
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ModelError(f"models file {path} (CANOPY_MODELS_FILE) does not exist") from None
    except (OSError, yaml.YAMLError) as error:
        raise ModelError(f"models file {path} is not readable YAML: {_first_line(error)}") from None
    if problem := _models_file_problem(config):
        raise ModelError(f"models file {path}: {problem}")
    return {"model_list": config.get("model_list", []), "router_settings": config.get("router_settings", {})}


def _environment_problem(litellm: ModuleType, params: dict[str, Any]) -> str | None:
    """What litellm needs for a deployment that it does not have (a provider, its variables)."""
    model = params["model"]
    try:
        litellm.get_llm_provider(model=model, api_base=params.get("api_base"))
        missing = litellm.validate_environment(model=model, api_key=params.get("api_key"),
                                               api_base=params.get("api_base")).get("missing_keys") or []
    except Exception:
        return (f"litellm knows no provider for the model {model!r}: write it as provider/model (openai/gpt-4o-mini, "
                "anthropic/claude-sonnet-4-5, ollama/llama3.1, ...), or name a model of the models file")
    if missing:
        return (f"the model {model!r} needs {', '.join(missing)}, which the model gateway does not have: set it in "
                "the environment Canopy starts from (`canopy up`), or put it in a file of that name in the secrets "
                "directory")
    return None


@dataclasses.dataclass
class _Endpoint:
    """An agent's own endpoint in a Router: its model string, the name its calls are accounted
    under, and how many calls hold it."""

    model: str
    accounted: str
    priced: frozenset[str]  # the entries adding it made in litellm.model_cost
    calls: int = 0


class _Routes:
    """One Router over the models file, the scripted model, the pass-through route and the
    agents' own endpoints (added as they are first used)."""

    def __init__(self, litellm: ModuleType, config: dict[str, Any], keys: _Keys, *, path: Path | None,
                 retries: int, timeout: float) -> None:
        self._litellm = litellm
        self._keys = keys
        self._path = path
        self.file_models = [self._resolved(index, d) for index, d in enumerate(config["model_list"])]
        names = {d["model_name"] for d in self.file_models}
        model_list = [*self.file_models, _SCRIPTED_ROUTE, *([] if "*" in names else [_PASS_THROUGH])]
        # Canopy's defaults; the file's router_settings win (rpm/tpm of a deployment are enforced).
        settings = {"num_retries": retries, "timeout": timeout,
                    "optional_pre_call_checks": ["enforce_model_rate_limits"],
                    **{key: value for key, value in config["router_settings"].items()
                       if value is not None or key not in _DEADLINE_SETTINGS}}
        # litellm's timeout bounds each read of a reply, not the reply: a provider that sends a piece
        # more often (a reply drip-fed, a stream that never ends) would hold the call, and its Run's
        # slot, for ever. A call ends within the timeout for each attempt it may make.
        self.deadline = float(settings["timeout"]) * (1 + settings["num_retries"])  # both checked
        try:
            self.router = litellm.Router(model_list=model_list, **settings)
        except Exception as error:
            raise ModelError(f"models file {path}: litellm's Router refused it: {_first_line(error)}") from None
        # model group -> the agent's endpoint, least recently used first
        self._endpoints: collections.OrderedDict[str, _Endpoint] = collections.OrderedDict()

    def _resolved(self, index: int, deployment: dict[str, Any]) -> dict[str, Any]:
        """``os.environ/NAME`` values read from the environment or the secrets directory, and the
        numbers among them checked (an unset one stays ``os.environ/NAME``: not a number)."""
        params = dict(deployment["litellm_params"])
        for key, value in params.items():
            if isinstance(value, str) and value.startswith(_ENV_REFERENCE):
                params[key] = self._keys.value(value[len(_ENV_REFERENCE):]) or value
        if problem := _numbers_problem(f"model_list[{index}].litellm_params", params, text=True):
            raise ModelError(f"models file {self._path}: {problem}")
        return {**deployment, "litellm_params": params}

    def provider_model(self, model: str) -> str:
        """The provider's model string behind a model name (the first deployment of a file model)."""
        return next((d["litellm_params"]["model"] for d in self.file_models if d["model_name"] == model), model)

    def answering_model(self, group: str | None, model: str) -> str:
        """The provider's model string that answered a call of ``model`` routed to ``group`` (while
        the call holds its route)."""
        own = self._endpoints.get(group or "")
        return own.model if own else self.provider_model(group or model)

    def display(self, group: str | None, model: str) -> str:
        """The name a call is accounted under: the model group, the agent's model string, or for an
        agent's own endpoint ``model @ api_base`` (while the call holds its route)."""
        own = self._endpoints.get(group or "")
        return own.accounted if own else group or model

    def _own_endpoint(self, model: str, api_base: str | None, api_key_ref: str | None) -> dict[str, Any] | None:
        """The deployment of an agent's own endpoint, or None when the call takes a shared route."""
        if model.startswith(SCRIPTED_PREFIX) or not (api_base or api_key_ref):
            return None
        if any(d["model_name"] == model for d in self.file_models):
            raise ModelError(f"the model {model!r} is a model of the models file {self._path}: its endpoint and key "
                             "come from there; leave api_base and api_key_ref unset")
        key = self._keys.agent_key(api_key_ref) if api_key_ref else NO_KEY
        return {"model": model, "api_key": key, **({"api_base": api_base} if api_base else {})}

    @contextlib.contextmanager
    def route(self, model: str, api_base: str | None, api_key_ref: str | None) -> Iterator[str]:
        """The model group a call goes to, held while the call lasts: an agent's own endpoint is
        added to the Router as its call begins, and forgotten only when no call holds it and
        ENDPOINTS_KEPT more recently used ones are kept."""
        params = self._own_endpoint(model, api_base, api_key_ref)
        if params is None:
            yield model
            return
        identity = json.dumps([model, api_base, api_key_ref]).encode()
        group = "canopy-endpoint-" + hashlib.sha256(identity).hexdigest()[:16]
        endpoint = self._endpoints.get(group)
        if endpoint is None:
            from litellm.types.router import Deployment, LiteLLM_Params

            priced = set(self._litellm.model_cost)
            self.router.add_deployment(Deployment(model_name=group, litellm_params=LiteLLM_Params(**params),
                                                  model_info={"id": group}))
            endpoint = self._endpoints[group] = _Endpoint(model, accounted_name(model, api_base),
                                                          frozenset(self._litellm.model_cost.keys() - priced))
        self._endpoints.move_to_end(group)
        endpoint.calls += 1
        try:
            yield group
        finally:
            endpoint.calls -= 1
            self._forget_idle_endpoints()

    def _forget_idle_endpoints(self) -> None:
        if len(self._endpoints) <= ENDPOINTS_KEPT:  # every call's end comes here: no list to build
            return
        from litellm.router_api import ChangeSet

        idle = [group for group, endpoint in self._endpoints.items() if not endpoint.calls]
        for group in idle[:len(self._endpoints) - ENDPOINTS_KEPT]:
            forgotten = self._endpoints.pop(group)
            self.router.apply(ChangeSet(delete=[group]))
            # Deleting a deployment leaves the price entries litellm made for it (its id's, and its
            # model string's when new), which an agent's model string per endpoint would grow for ever.
            shared = {key for endpoint in self._endpoints.values() for key in (*endpoint.priced, endpoint.model)}
            for key in forgotten.priced - shared:
                self._litellm.model_cost.pop(key, None)

    def _deployments_of(self, model: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The models file's deployments named ``model``, and those whose name pattern matches it."""
        exact = [d for d in self.file_models if d["model_name"] == model]
        patterns = [d for d in self.file_models
                    if "*" in d["model_name"] and fnmatch.fnmatchcase(model, d["model_name"])]
        return exact, patterns

    def operators(self, model: str) -> bool:
        """Whether the models file routes ``model`` (by its name or a pattern): the operator's word."""
        return any(self._deployments_of(model))

    def problem(self, model: str, api_base: str | None, api_key_ref: str | None) -> str | None:
        """Why a call with these would fail before reaching the provider, or None (changes nothing)."""
        if model.startswith(SCRIPTED_PREFIX):
            return "the scripted model takes no api_base or api_key_ref" if api_base or api_key_ref else None
        try:
            own = self._own_endpoint(model, api_base, api_key_ref)
        except ModelError as error:
            return str(error)
        if own is not None:
            return _environment_problem(self._litellm, own)
        exact, patterns = self._deployments_of(model)
        for deployment in exact or patterns[:1]:
            params = {**deployment["litellm_params"], **({} if exact else {"model": model})}
            unresolved = [v for v in params.values() if isinstance(v, str) and v.startswith(_ENV_REFERENCE)]
            if unresolved:
                return (f"the models file's {deployment['model_name']!r} reads {unresolved[0]}, which the model "
                        "gateway has neither in its environment nor as a secret file")
            if problem := _environment_problem(self._litellm, params):
                return problem
        return None if exact or patterns else _environment_problem(self._litellm, {"model": model})


# ---------------------------------------------------------------------------
# The gateway
# ---------------------------------------------------------------------------


class _StreamCut(Exception):
    """A stream that opened failed before its end (the connection dropped, the provider sent an error
    event): the Router retried its opening only, so the call asks again. litellm's failure callback
    has recorded the attempt."""


async def _streamed(router: Any, litellm: ModuleType, request: dict[str, Any],
                    on_delta: Callable[[str], Awaitable[None]], max_chars: int) -> tuple[Any, dict[str, Any]]:
    """Stream the reply, hand over text deltas, and rebuild the whole response from the chunks;
    with the stream's hidden params (the whole response built from chunks has none of its own).
    _StreamCut when the stream fails after it opened. Past ``max_chars`` it stops reading: the reply
    built is the part that came."""
    stream = await router.acompletion(**request, stream=True, stream_options={"include_usage": True})
    chunks = []
    chars = 0
    try:
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) > _MAX_STREAM_CHUNKS:
                raise ModelError(f"the provider's stream sent more than {_MAX_STREAM_CHUNKS} chunks; it was cut off")
            chars += _reply_chars(chunk.choices[0].delta) if chunk.choices else 0
            if chars > max_chars:  # what came is billed, and the reply is refused whole (ModelGateway.complete)
                with contextlib.suppress(Exception):
                    await stream.aclose()  # the provider stops generating what nobody reads
                break
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                await on_delta(delta)
    except ModelError:
        raise
    except Exception as error:
        raise _StreamCut(_first_line(error)) from error
    return litellm.stream_chunk_builder(chunks, messages=request["messages"]), getattr(stream, "_hidden_params", {})


def accounted_name(model: str, api_base: str | None) -> str:
    """The name a call is counted and recorded under: an agent's own endpoint's as ``model @
    api_base`` (it may name any model and report any usage, which must not count in the series of
    the model the operator's route serves under that name)."""
    return f"{model} @ {api_base}" if api_base else model


def _model_group(hidden: dict[str, Any]) -> str | None:
    return (hidden.get("additional_headers") or {}).get("x-litellm-model-group")


class ModelGateway:
    """Model calls with routing, retries, fallbacks, limits, timeouts and cancellation; no persistence here."""

    def __init__(
        self,
        scripted_port: int = 0,
        log_path: str | None = None,
        timeout_seconds: float = 120.0,
        retries: int = 2,
        models_file: str | None = None,
        secrets_dir: str | None = None,
        provider_env: Sequence[str] = (),
        agent_api_bases: Sequence[str] | Mapping[str, Sequence[str]] = (),
        max_reply_chars: int = 1_000_000,
    ) -> None:
        self._scripted_port = scripted_port
        self._log_path = log_path
        self._timeout = timeout_seconds
        self._retries = max(0, retries)
        self._models_file = Path(models_file) if models_file else None
        self._keys = _Keys(Path(secrets_dir) if secrets_dir else None, provider_env)
        self._api_bases = tuple(agent_api_bases)
        self._allowed_endpoints = _entries(agent_api_bases)  # read once, not per call
        self._max_reply_chars = max_reply_chars
        self._routes: _Routes | str | None = None  # the routes, or why the configuration has none
        self._routes_stamp: tuple[Any, ...] | None = None
        self._scripted: ScriptedModelServer | None = None
        self._scripted_lock = asyncio.Lock()

    async def scripted_base_url(self) -> str:
        """Base URL of the embedded scripted model, started on first use: on ``scripted_port``, or
        on a free port when that one is taken (each node's gateway runs its own, and the nodes
        of one machine share its ports; calls are given their gateway's URL, never a fixed one)."""
        async with self._scripted_lock:
            if self._scripted is None or not self._scripted.running:
                from actors.scripted.server import serve_scripted_model

                try:
                    self._scripted = await serve_scripted_model(port=self._scripted_port, log_path=self._log_path)
                except OSError:
                    if not self._scripted_port:
                        raise
                    self._scripted = await serve_scripted_model(port=0, log_path=self._log_path)
            return self._scripted.base_url

    async def request_log_path(self) -> str | None:
        return self._log_path

    async def scripted_in_flight_requests(self) -> int:
        """Requests the embedded scripted model is still answering (diagnostics and tests)."""
        return self._scripted.in_flight_requests if self._scripted is not None else 0

    async def scripted_waiting(self) -> dict[float, int]:
        """The embedded scripted model's requests waiting out their delay, by delay in seconds (tests)."""
        return self._scripted.waiting if self._scripted is not None else {}

    async def scripted_hangups(self) -> list[dict[str, float]]:
        """The embedded scripted model's requests whose caller hung up during their delay (tests)."""
        return self._scripted.hangups if self._scripted is not None else []

    async def warm_up(self) -> None:
        """Pay the litellm import and the first routes up front (complete() does it lazily otherwise)."""
        with contextlib.suppress(ModelError):  # a broken models file is reported by every call and check
            self._current_routes()

    async def close(self) -> None:
        """Stop the embedded scripted model, if it was started."""
        if self._scripted is not None:
            await self._scripted.stop()
            self._scripted = None

    def _current_routes(self) -> _Routes:
        """The routes of the models file and secrets as they are now: rebuilt when either changed
        (a stat of each per call; in-flight calls finish on the routes they started with)."""
        litellm = _litellm()
        stamp = (_file_stamp(self._models_file), self._keys.stamp())
        if self._routes is None or stamp != self._routes_stamp:
            self._keys.load_provider_env()
            try:
                config = _read_models_file(self._models_file) if self._models_file else _NO_MODELS_FILE
                self._routes = _Routes(litellm, config, self._keys, path=self._models_file, retries=self._retries,
                                       timeout=self._timeout)
            except ModelError as error:
                self._routes = str(error)
            self._routes_stamp = stamp
        if isinstance(self._routes, str):
            raise ModelError(self._routes)
        return self._routes

    def file_model_names(self) -> frozenset[str]:
        """The model names of the models file as it is now: the operator's own models."""
        try:
            return frozenset(deployment["model_name"] for deployment in self._current_routes().file_models)
        except ModelError:
            return frozenset()

    def _check_endpoint(self, routes: _Routes, model: str, api_base: str | None, api_key_ref: str | None) -> None:
        """An agent's calls go only where the operator lets them: its api_base must be a listed endpoint
        (whoever may create agents names it, and the gateway asks it from inside the cluster: the Ray
        dashboard, a metadata service, any loopback port, its answer shown back in the Turn's error),
        with a key listed for it when the operator names its keys; and its model string must not hold
        a URL (some of litellm's providers, oobabooga and huggingface, call the URL a model string
        names, round the list)."""
        if "://" in model:
            raise ModelError(f"the model {model[:200]!r} holds a URL: an agent's endpoint is its api_base, one of "
                             "the endpoints the operator lists in CANOPY_AGENT_API_BASES")
        if not api_base:
            self._check_default_endpoint(routes, model, api_key_ref)
            return
        keys = _allowed_keys(api_base, self._allowed_endpoints)
        if not keys:
            raise ModelError(f"api_base {api_base!r} is not one of the endpoints agents may use "
                             f"(CANOPY_AGENT_API_BASES: {', '.join(self._api_bases) or 'none listed'})")
        if api_key_ref and not any(listed is None or api_key_ref in listed for listed in keys):
            named = sorted(set().union(*(listed for listed in keys if listed is not None)))
            raise ModelError(f"api_key_ref {api_key_ref!r} is not a key agents may send to {api_base!r} "
                             f"(CANOPY_AGENT_API_BASES lists {', '.join(named) or 'none'} for it)")

    def _check_default_endpoint(self, routes: _Routes, model: str, api_key_ref: str | None) -> None:
        """Without an api_base a call goes where litellm's provider goes by default, and for some that
        is a server on the gateway's own machine (llamafile: 127.0.0.1:8080, lemonade: the API's own
        port), where a sandbox command may listen: no key an agent names goes there, and no call of
        a model the models file does not route."""
        if api_key_ref:
            raise ModelError(f"api_key_ref {api_key_ref!r} without an api_base: a key an agent names goes only to "
                             "its api_base, one of the endpoints the operator lists in CANOPY_AGENT_API_BASES")
        if model.startswith(SCRIPTED_PREFIX) or routes.operators(model):
            return
        if local := _local_default(_litellm(), model, self._keys):
            raise ModelError(f"the model {model[:200]!r} is served by default from {local}, on the model gateway's "
                             "own machine: an agent reaches a local server only as its api_base, one of the "
                             "endpoints the operator lists in CANOPY_AGENT_API_BASES, or as a model of the models file")

    async def check_model(self, model: str, api_base: str | None = None, api_key_ref: str | None = None) -> str | None:
        """Why a call to ``model`` (with an agent's ``api_base``/``api_key_ref``) cannot work, as a
        sentence that names what is missing; None when litellm has all it needs. Makes no request."""
        try:
            routes = self._current_routes()
            self._check_endpoint(routes, model, api_base, api_key_ref)
            return routes.problem(model, api_base, api_key_ref)
        except ModelError as error:
            return str(error)

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        api_base: str | None = None,
        api_key_ref: str | None = None,
        on_delta: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """One model reply. Raises ModelError when the call fails for good (a non-transient error,
        or retries and fallbacks used up); ``failed_attempts`` are the requests that failed on the way.

        With ``on_delta`` the reply is streamed and each text delta is handed over as it
        arrives (for live watchers; a retried call may repeat deltas — only the final
        message is durable). Cancelling the awaiting task (``ray.cancel`` on the actor
        call) aborts the HTTP request.
        """
        routes = self._current_routes()
        self._check_endpoint(routes, model, api_base, api_key_ref)
        with routes.route(model, api_base, api_key_ref) as target:
            return await self._complete(routes, target, model, messages, tools, on_delta)

    async def _complete(self, routes: _Routes, target: str, model: str, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None,
                        on_delta: Callable[[str], Awaitable[None]] | None) -> dict[str, Any]:
        litellm = _litellm()
        from actors import bounded_http  # loaded by _litellm()

        call_id = uuid.uuid4().hex
        request: dict[str, Any] = {"model": target, "messages": to_openai_messages(messages),
                                   "metadata": {_CALL_KEY: call_id}}
        if model.startswith(SCRIPTED_PREFIX):
            request["api_base"] = await self.scripted_base_url()
        if tools:
            request["tools"] = to_openai_tools(tools)
        started = time.monotonic()
        failed = _failed_attempts[call_id] = []
        bound = bounded_http.Bound.for_reply_chars(self._max_reply_chars)
        try:
            with bounded_http.bounded(bound):
                async with asyncio.timeout(routes.deadline):
                    response, hidden, priced = await self._reply(routes, litellm, request, on_delta, bound)
        except TimeoutError as error:
            raise ModelError(f"the model call took longer than {routes.deadline:g} s (its timeout for each attempt "
                             "it may make): it was cut off", [_attempt(routes, a, model) for a in failed]) from error
        except Exception as error:
            attempts = [_attempt(routes, a, model) for a in failed]
            if bound.cut:  # whatever litellm made of it (a dropped connection, retried and refused)
                raise ModelError(f"the model's reply was not read further, nor asked again: {bound.cut} (a reply "
                                 f"of the {self._max_reply_chars:,} characters a reply may hold, setting "
                                 f"CANOPY_MAX_REPLY_CHARS, takes at most {bound.max_bytes:,})", attempts) from error
            tries = f" (after {len(attempts)} attempts)" if len(attempts) > 1 else ""
            raise ModelError(_first_line(error) + tries, attempts, passing=passes(error)) from error
        finally:
            del _failed_attempts[call_id]
        if not getattr(response, "choices", None):  # e.g. a provider's content filter, answering 200
            raise ModelError("the provider's reply held no choices: nothing was generated",
                             [_attempt(routes, a, model) for a in failed])
        chars = _reply_chars(response.choices[0].message)
        if not _usage_reported(response):
            if chars > self._max_reply_chars:  # counting it would take as long as it is: ~4 characters a token
                _estimated(litellm, response, 0, chars // 4)
            else:
                await asyncio.to_thread(_estimate_usage, litellm, response, request["messages"], self._counted(model))
            priced = None  # litellm priced the tokens it was told: none
        group = _model_group(hidden)
        deployment = (hidden.get("model_id") or "", routes.answering_model(group, model))
        cost = 0.0 if model.startswith(SCRIPTED_PREFIX) else _cost(litellm, response, priced, deployment)
        accounted = {"model": routes.display(group, model), "usage": _usage(response), "cost_usd": cost}
        if chars > self._max_reply_chars:
            raise ModelError(f"the model's reply was {chars:,} characters or more, more than the "
                             f"{self._max_reply_chars:,} characters a reply may hold (setting CANOPY_MAX_REPLY_CHARS): "
                             "it was not kept", [_attempt(routes, a, model) for a in failed], charged=accounted)
        return {
            "message": _message(response),
            **accounted,
            "latency_ms": (time.monotonic() - started) * 1000,
            "failed_attempts": [_attempt(routes, a, model) for a in failed],
        }

    async def _reply(self, routes: _Routes, litellm: ModuleType, request: dict[str, Any],
                     on_delta: Callable[[str], Awaitable[None]] | None,
                     bound: bounded_http.Bound) -> tuple[Any, dict[str, Any], Any]:
        """The response, its hidden params and litellm's price of it (None: to be priced). A stream
        cut off midway is asked again whole, with the Router's retries: its watchers get no more
        deltas, and the final message is what is kept anyway. ``bound`` reads a stream by line and
        a whole reply whole, whatever the endpoint calls its body."""
        if on_delta is not None:
            bound.by_line = True
            try:
                response, hidden = await _streamed(routes.router, litellm, request, on_delta, self._max_reply_chars)
                return response, hidden, None
            except _StreamCut as cut:
                log.warning("a streamed model reply was cut off (%s); asking again", cut)
        bound.by_line = False
        response = await routes.router.acompletion(**request)
        hidden = getattr(response, "_hidden_params", {})
        return response, hidden, hidden.get("response_cost")

    async def count_tokens(self, *, model: str, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None = None) -> int:
        """The prompt tokens a request would send, by litellm's counter for the model (in a thread:
        counting a long history takes a while, and this process serves every model call)."""
        litellm = _litellm()
        return int(await asyncio.to_thread(litellm.token_counter, model=self._counted(model),
                                           messages=to_openai_messages(messages),
                                           tools=to_openai_tools(tools) if tools else None))

    def _counted(self, model: str) -> str:
        """The model whose tokenizer counts ``model``'s tokens."""
        if model.startswith(SCRIPTED_PREFIX):
            return "openai/" + model[len(SCRIPTED_PREFIX):]
        with contextlib.suppress(ModelError):  # a broken models file: count as the model string says
            return self._current_routes().provider_model(model)
        return model


def _attempt(routes: _Routes, failed: dict[str, Any], model: str) -> dict[str, Any]:
    return {"model": routes.display(failed["group"], model), "error": failed["error"],
            "latency_ms": failed["latency_ms"], "ended_at": failed["ended_at"]}
