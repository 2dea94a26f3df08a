"""A session's work loop: a cancelled Run ends and the loop goes on; a cancelled loop ends."""

from __future__ import annotations

import asyncio

import pytest

from actors.session_actor import wait_for_run


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_cancelled_run_ends_and_the_loop_goes_on() -> None:
    run = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    run.cancel()
    await wait_for_run(run)  # returns: the loop goes on to its next Run
    assert run.cancelled()


async def test_a_cancelled_loop_ends_instead_of_waiting_on() -> None:
    run = asyncio.create_task(_forever())

    async def loop() -> str:
        await wait_for_run(run)
        return "went on"  # swallowing its own cancellation, the loop would get here and carry on

    waiting = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, timeout=2)
    assert waiting.cancelled() and run.cancelled()
