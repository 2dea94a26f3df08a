"""Whether a node's actor still serves, asked apart from the calls it serves.

The sweeper kills a node's model gateway or sandbox host that answers nothing for
``actor_answer_seconds``, for Ray to start it again (actors/sweeper.py ``restart_silent``). Ray's
``__ray_ready__`` waits for a free slot of the actor's ``max_concurrency``: a gateway whose every slot
held a slow model call was taken for a stuck one and killed, with all its calls. ``answers`` runs in
a concurrency group of its own (in Ray's async actors, a thread and event loop of its own) and has
the serving loop run one step: it answers while that loop runs, whatever its calls hold, and not
while the loop is blocked or the process stopped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray


class AnswersApart:
    """Made on the actor's serving loop: Ray runs an async actor's ``__init__`` there. A class that
    mixes it in is made an actor class by :func:`answering_actor`."""

    def __init__(self) -> None:
        self._serving_loop = asyncio.get_running_loop()

    @ray.method(concurrency_group="liveness")
    async def answers(self) -> bool:
        """True once the serving loop has run a step."""
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._serving_loop))
        return True


def answering_actor(cls: type[AnswersApart]) -> Any:
    """``ray.remote`` of an :class:`AnswersApart` class, with the concurrency group its ``answers`` runs in."""
    return ray.remote(concurrency_groups={"liveness": 1})(cls)
