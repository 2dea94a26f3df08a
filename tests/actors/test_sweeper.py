"""The sweeper's own loop (actors/sweeper.py); what it recovers is tested where each record lives."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray

from actors import ray_compat
from actors.liveness import AnswersApart, answering_actor
from actors.naming import NAMESPACE, gateway_actor_name
from actors.runtime import Runtime
from actors.sweeper import restart_silent
from tests.actors.helpers import eventually, freed_only_by_the_loop


@pytest.mark.default_shape  # the sweeper is one per cluster, whichever the shape
async def test_a_slow_lookup_of_an_actor_holds_up_nothing_else_of_the_sweeper(
        runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding a named actor is a call to Ray's GCS, which can take seconds (a GCS under load or
    restarting). Made on the sweeper's event loop, it held every round (recoveries, waits,
    schedules) that long: here the loop must still run while a lookup is under way."""
    name = gateway_actor_name(ray.get_runtime_context().get_node_id())
    # Only an actor Ray's table says is alive is asked (one restarting after an earlier test is not).
    await eventually(lambda: asyncio.to_thread(lambda: name in ray_compat.alive_actors()), timeout=60)
    look_up = ray.get_actor
    async with freed_only_by_the_loop() as (hold, held):

        def slow_look_up(*args: Any, **kwargs: Any) -> Any:
            hold()
            return look_up(*args, **kwargs)

        monkeypatch.setattr(ray, "get_actor", slow_look_up)
        assert await restart_silent([name], timeout=30) == []  # the gateway answers: kept
    assert held == [True]


class _Serving(AnswersApart):
    async def hold(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def block(self, seconds: float, started: str) -> None:
        Path(started).touch()
        time.sleep(seconds)  # the serving loop runs nothing else meanwhile


@pytest.mark.default_shape  # no session: the test process makes the actor
async def test_an_actor_whose_every_slot_holds_a_slow_call_answers_and_one_whose_loop_is_blocked_does_not(
        runtime: Runtime, tmp_path: Path) -> None:
    """A node's gateway holds up to 1,000 model calls at once, each up to minutes with a slow
    provider: a check that waited for a free slot (Ray's ``__ray_ready__``) took a gateway whose
    every slot was held for a stuck one and killed it, with all its calls. Its serving loop is
    asked apart from them; a loop that is blocked still answers nothing."""
    name = f"serving-{uuid.uuid4().hex[:8]}"
    actor = answering_actor(_Serving).options(name=name, namespace=NAMESPACE, max_concurrency=3).remote()
    try:
        await actor.__ray_ready__.remote()
        await eventually(lambda: asyncio.to_thread(lambda: name in ray_compat.alive_actors()), timeout=60)
        holds = [actor.hold.remote(300) for _ in range(3)]
        with pytest.raises(TimeoutError):  # every slot is held: a call waits
            await asyncio.wait_for(actor.__ray_ready__.remote(), 5)
        assert await restart_silent([name], timeout=15) == []
        for hold in holds:
            ray.cancel(hold)
        started = tmp_path / "blocked"
        blocked = actor.block.remote(300, str(started))
        await eventually(lambda: asyncio.sleep(0, started.exists()), timeout=60)
        assert await restart_silent([name], timeout=5) == [name]
        del blocked
    finally:
        ray.kill(actor)


class _SlowToStart(AnswersApart):
    def __init__(self, seconds: float, started: str) -> None:
        super().__init__()
        Path(started).touch()
        time.sleep(seconds)  # as a gateway's start that imports litellm on a loaded node

    async def answer(self) -> str:
        return "answered"


@pytest.mark.default_shape  # no session: the test process makes the actor
async def test_an_actor_still_starting_is_not_taken_for_a_silent_one(runtime: Runtime, tmp_path: Path) -> None:
    """A node's gateway imports litellm as it starts, seconds on a loaded node: the check asks only
    the actors Ray's table says are alive, and one whose start is under way is not, so it is neither
    asked (the call would wait for the start) nor killed."""
    name, started = f"starting-{uuid.uuid4().hex[:8]}", tmp_path / "started"
    actor = answering_actor(_SlowToStart).options(name=name, namespace=NAMESPACE).remote(10, str(started))
    try:
        await eventually(lambda: asyncio.sleep(0, started.exists()), timeout=60)
        assert name not in await asyncio.to_thread(ray_compat.alive_actors)
        assert await restart_silent([name], timeout=2) == []
        assert await asyncio.wait_for(actor.answer.remote(), 60) == "answered"
        assert (await asyncio.to_thread(ray_compat.alive_actors))[name][1] == 0  # never restarted
    finally:
        ray.kill(actor)
