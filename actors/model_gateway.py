"""ModelGateway: the only place that imports litellm (SPEC §10, §13).

The class is plain so that tests can use it directly; the runtime wraps it as an async Ray
actor (``ray.remote(ModelGateway).options(name="canopy:model-gateway", namespace="canopy",
max_concurrency=1000, num_cpus=0, max_restarts=-1)``). Every method is a coroutine so
that, as an actor, all calls share one event loop with the embedded scripted model.

litellm is imported on first use: it costs seconds and hundreds of MB, and only the
gateway process should pay that, not every module that imports this one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.scripted.server import ScriptedModelServer

SCRIPTED_PREFIX = "canopy/"
# The scripted endpoint ignores the key, but litellm's OpenAI client insists on one.
SCRIPTED_API_KEY = "canopy-scripted"
_BACKOFF_BASE_SECONDS = 0.5
_BACKOFF_MAX_SECONDS = 8.0


class ModelError(Exception):
    """A model call failed for good; the message carries the provider's error text."""


@functools.cache
def _litellm() -> ModuleType:
    # Without this litellm fetches its price map from GitHub at import time (no network here).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    from actors.scripted import MODEL_ID

    litellm.suppress_debug_info = True
    # litellm prices every reply; a model missing from its price map costs a search through the
    # whole map on each call (~8 % of a scripted call's CPU). The scripted model is free.
    # Every price is given (cache reads and writes too), or litellm warns that it assumes zero.
    litellm.register_model({"openai/" + MODEL_ID: {
        "litellm_provider": "openai", "mode": "chat", "supports_function_calling": True,
        "input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
        "cache_creation_input_token_cost": 0.0, "cache_read_input_token_cost": 0.0}})
    return litellm


def _transient_errors(litellm: ModuleType) -> tuple[type[BaseException], ...]:
    return (
        litellm.RateLimitError,
        litellm.APIConnectionError,
        litellm.Timeout,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
    )


def _backoff_seconds(attempt: int) -> float:
    return min(_BACKOFF_MAX_SECONDS, _BACKOFF_BASE_SECONDS * 2**attempt)


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
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    message = dict(message)
    if message.get("tool_calls"):
        message["tool_calls"] = [_openai_tool_call(c) for c in message["tool_calls"]]
    elif "tool_calls" in message:
        del message["tool_calls"]  # providers reject an empty tool_calls list
    if message.get("role") == "tool" and not isinstance(message.get("content"), str):
        message["content"] = json.dumps(message.get("content"))
    return message


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accept assistant tool calls both in OpenAI shape and in the shape complete() returns."""
    return [_openai_message(m) for m in messages]


def to_openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accept tools both as OpenAI ``{"type": "function", "function": ...}`` and as bare functions."""
    return [t if "function" in t else {"type": "function", "function": t} for t in tools]


def _arguments(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    # Kept visible rather than dropped so the tool layer can tell the model what was wrong.
    return {"_invalid_arguments": raw}


def _message(response: Any) -> dict[str, Any]:
    message = response.choices[0].message
    tool_calls = [
        {"id": call.id, "name": call.function.name, "arguments": _arguments(call.function.arguments)}
        for call in (message.tool_calls or [])
    ]
    return {"role": "assistant", "content": message.content, "tool_calls": tool_calls}


def _usage(response: Any) -> dict[str, int]:
    usage = getattr(response, "usage", None)
    return {
        "prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
        "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0),
    }


def _cost(litellm: ModuleType, response: Any, model: str) -> float:
    if model.startswith(SCRIPTED_PREFIX):
        return 0.0
    try:
        return float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:  # unknown models have no price; accounting must not fail the call
        return 0.0


# ---------------------------------------------------------------------------
# The gateway
# ---------------------------------------------------------------------------


async def _streamed(litellm: ModuleType, request: dict[str, Any], on_delta: Callable[[str], Awaitable[None]]) -> Any:
    """Stream the reply, hand over text deltas, and rebuild the whole response from the chunks."""
    stream = await litellm.acompletion(**request, stream=True, stream_options={"include_usage": True})
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            await on_delta(delta)
    return litellm.stream_chunk_builder(chunks, messages=request["messages"])


class ModelGateway:
    """Model calls with routing, retries, timeouts and cancellation; no persistence here."""

    def __init__(
        self,
        scripted_port: int = 0,
        log_path: str | None = None,
        timeout_seconds: float = 120.0,
        retries: int = 2,
    ) -> None:
        self._scripted_port = scripted_port
        self._log_path = log_path
        self._timeout = timeout_seconds
        self._retries = max(0, retries)
        self._scripted: ScriptedModelServer | None = None
        self._scripted_lock = asyncio.Lock()

    async def scripted_base_url(self) -> str:
        """Base URL of the embedded scripted model, started on first use."""
        async with self._scripted_lock:
            if self._scripted is None or not self._scripted.running:
                from actors.scripted.server import serve_scripted_model

                self._scripted = await serve_scripted_model(port=self._scripted_port, log_path=self._log_path)
            return self._scripted.base_url

    async def request_log_path(self) -> str | None:
        return self._log_path

    async def scripted_in_flight_requests(self) -> int:
        """Requests the embedded scripted model is still answering (diagnostics and tests)."""
        return self._scripted.in_flight_requests if self._scripted is not None else 0

    async def warm_up(self) -> None:
        """Pay the litellm import up front (optional; complete() does it lazily otherwise)."""
        _litellm()

    async def close(self) -> None:
        """Stop the embedded scripted model, if it was started."""
        if self._scripted is not None:
            await self._scripted.stop()
            self._scripted = None

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        api_key: str | None = None,
        api_base: str | None = None,
        on_delta: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """One model reply. Raises ModelError on a non-transient error or when retries run out.

        With ``on_delta`` the reply is streamed and each text delta is handed over as it
        arrives (for live watchers; a retried call may repeat deltas — only the final
        message is durable). Cancelling the awaiting task (``ray.cancel`` on the actor
        call) aborts the HTTP request.
        """
        litellm = _litellm()
        request = await self._route(model, api_key, api_base)
        request["messages"] = to_openai_messages(messages)
        if tools:
            request["tools"] = to_openai_tools(tools)
        started = time.monotonic()
        response, attempts = await self._call_with_retries(litellm, request, on_delta)
        return {
            "message": _message(response),
            "usage": _usage(response),
            "cost_usd": _cost(litellm, response, model),
            "latency_ms": (time.monotonic() - started) * 1000,
            "model": model,
            "attempts": attempts,
        }

    async def count_tokens(self, *, model: str, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None = None) -> int:
        """The prompt tokens a request would send, by litellm's counter for the model (in a thread:
        counting a long history takes a while, and this process serves every model call)."""
        litellm = _litellm()
        counted = (model if not model.startswith(SCRIPTED_PREFIX) else "openai/" + model[len(SCRIPTED_PREFIX):])
        return int(await asyncio.to_thread(litellm.token_counter, model=counted,
                                           messages=to_openai_messages(messages),
                                           tools=to_openai_tools(tools) if tools else None))

    async def _route(self, model: str, api_key: str | None, api_base: str | None) -> dict[str, Any]:
        if model.startswith(SCRIPTED_PREFIX):
            route = {
                "model": "openai/" + model[len(SCRIPTED_PREFIX) :],
                "api_base": await self.scripted_base_url(),
                "api_key": SCRIPTED_API_KEY,
            }
        else:
            route = {"model": model}
            if api_key:
                route["api_key"] = api_key
            if api_base:
                route["api_base"] = api_base
        # Retries are ours (with backoff and a clear final error); the SDK's would multiply them.
        return {**route, "timeout": self._timeout, "num_retries": 0, "max_retries": 0}

    async def _call_with_retries(
        self, litellm: ModuleType, request: dict[str, Any], on_delta: Callable[[str], Awaitable[None]] | None
    ) -> tuple[Any, int]:
        transient = _transient_errors(litellm)
        for attempt in range(self._retries + 1):
            try:
                if on_delta is None:
                    return await litellm.acompletion(**request), attempt + 1
                return await _streamed(litellm, request, on_delta), attempt + 1
            except transient as exc:
                if attempt == self._retries:
                    raise ModelError(f"model call failed after {attempt + 1} attempt(s): {exc}") from exc
                await asyncio.sleep(_backoff_seconds(attempt))
            except Exception as exc:
                raise ModelError(str(exc)) from exc
        raise AssertionError("unreachable: the loop returns or raises")
