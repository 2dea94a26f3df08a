"""The sweeper's own loop (actors/sweeper.py); what it recovers is tested where each record lives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import ray

from actors import ray_compat
from actors.naming import gateway_actor_name
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
