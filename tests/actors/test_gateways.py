"""One model gateway per node (actors/gateways.py): a call whose gateway dies under it is asked again
(of a fresh gateway, or of the same one once Ray restarted it), the Turn completes, and the Run is
charged once. Several nodes: see gateways_scenario.py (a cluster of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import ray
from ray.util.state import list_actors

from actors import gateways
from actors.gateway_actor import (
    CALL_ABORTED,
    CALLER_GONE,
    DELTA_CHANNEL,
    AccountedGateway,
    Caller,
    _CallsInFlight,
    _Flight,
    _process,
    _reply_chars,
    _runs,
    _SharedCalls,
    this_process,
)
from actors.gateways import gateway_on
from actors.liveness import AnswersApart, answering_actor
from actors.naming import NodeLocal, gateway_actor_name, node_local_options
from actors.runtime import MALLOC_ARENA_MAX, Runtime
from actors.scripted import say, script
from persistence import notifications
from persistence.databases import rows
from persistence.db import Database
from persistence.records import Scope
from persistence.settings import get_settings
from tests.actors.gateways_scenario import PINNED_ENV, requests_with
from tests.actors.helpers import eventually, freed_only_by_the_loop, model_gateway, scenario_findings
from tests.actors.replay_server import ReplayServer
from tests.conftest import RUNTIME_ENV
from tests.persistence.helpers import tcp_link


async def _alive_gateway(node_id: str, not_pid: int | None = None) -> Any:
    """The node's gateway as Ray's actor table has it (its pid, restarts), once it is alive (in
    another process than ``not_pid``)."""

    async def alive() -> Any:
        found = await asyncio.to_thread(list_actors, address=ray.get_runtime_context().gcs_address,
                                        filters=[("name", "=", gateway_actor_name(node_id)), ("state", "=", "ALIVE")])
        return found[0] if found and found[0].pid != not_pid else None

    return await eventually(alive, timeout=30)


# kill -9 as many times as a call asks fresh gateways (gateways.CALL_ATTEMPTS), one after another
# while the call is in flight: waiting for a restarting gateway must not use those attempts up.
KILLS = {"ray.kill": 1, "kill -9": 3}


@pytest.mark.default_shape  # the node's gateway dies, not a session's process: its callers' retry is one code
@pytest.mark.parametrize("how", list(KILLS))
async def test_a_call_whose_gateway_dies_is_asked_again_and_charged_once(runtime: Runtime, scope: Scope,
                                                                          how: str) -> None:
    """``ray.kill``: the gateway is gone for good and a new one is made; ``kill -9``: its process dies
    and Ray restarts it (``max_restarts``), here three times in a row, each time the call is in
    flight in the restarted process. Either way the call is asked again until it is answered."""
    marker = f"survived-{uuid.uuid4().hex[:8]}"
    created = await runtime.create_root(scope, input_text=script(say(marker, delay_ms=6000)))
    node_id = ray.get_runtime_context().get_node_id()  # one node: the session's and this process's
    killed = None
    for kill in range(KILLS[how]):

        async def in_flight(asked: int = kill + 1) -> bool:
            return requests_with(runtime.settings, marker) >= asked  # more: the count asserted below says so

        await eventually(in_flight, timeout=120)  # a restart on a loaded machine has taken a minute
        # its scripted model waits out the call's delay in this process
        killed = await _alive_gateway(node_id, not_pid=killed.pid if killed else None)
        if how == "ray.kill":
            ray.kill(gateway_on(node_id))
        else:
            os.kill(killed.pid, signal.SIGKILL)
    assert killed is not None

    # The last restart may be as slow as those waited for above, then the call takes its 6 s.
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=150)
    assert result["status"] == "completed", result
    assert result["output"] == marker
    assert requests_with(runtime.settings, marker) == KILLS[how] + 1  # the lost requests, and the one answered
    assert (await _alive_gateway(node_id)).pid != killed.pid  # another gateway process answered

    session_id = created["session"]["session_id"]
    replies = await rows(runtime.db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'assistant'",
                         session_id)
    assert [reply["content"] for reply in replies] == [marker]
    runs = await rows(runtime.db, "SELECT run_id, status, prompt_tokens, completion_tokens, model_calls FROM runs "
                      "WHERE session_id = %s", session_id)
    assert len(runs) == 1 and runs[0]["status"] == "completed" and runs[0]["model_calls"] == 1, runs
    assert runs[0]["prompt_tokens"] > 0

    async def recorded() -> list[dict[str, Any]]:
        return await rows(runtime.db, "SELECT prompt_tokens, completion_tokens, error, node_id FROM model_calls "
                          "WHERE run_id = %s", runs[0]["run_id"])

    await eventually(recorded, timeout=10)
    await asyncio.sleep(0.5)  # a second record would have been flushed by now (the gateway writes within 50 ms)
    calls = await recorded()
    assert calls == [{"prompt_tokens": runs[0]["prompt_tokens"], "completion_tokens": runs[0]["completion_tokens"],
                      "error": None, "node_id": node_id}], calls  # the dead gateway recorded nothing
    usage = await rows(runtime.db, "SELECT prompt_tokens, model_calls FROM tree_usage WHERE tree_id = %s", session_id)
    assert usage == [{"prompt_tokens": runs[0]["prompt_tokens"], "model_calls": 1}]


@contextlib.asynccontextmanager
async def _answer_asked(actor: Any, path: Path) -> AsyncIterator[tuple[NodeLocal, asyncio.Task[Any]]]:
    """A per-node instance of a test's ``actor`` (given ``path``), and its ``answer`` asked through
    the gateways' retries (``gateways.ask``); the call and the actor end with the block."""
    name = f"asked-{uuid.uuid4().hex[:8]}"
    actor_class = answering_actor(actor)
    local = NodeLocal(lambda node_id: actor_class.options(**node_local_options(name, node_id)).remote(str(path)))
    call = asyncio.create_task(gateways.ask(local, "answer"))
    try:
        yield local, call
    finally:
        call.cancel()
        ray.kill(await local.handle())


class _HeldTwice(AnswersApart):
    """Holds its first two asks until it is killed under them and answers the third; a file counts
    the asks (a restarted process starts with nothing)."""

    def __init__(self, asks: str) -> None:
        super().__init__()
        self.asks = Path(asks)

    async def pid(self) -> int:
        return os.getpid()

    async def answer(self) -> int:
        with self.asks.open("a") as file:
            file.write("ask\n")
        asked = len(self.asks.read_text().splitlines())
        if asked < 3:
            await asyncio.sleep(300)
        return asked


@pytest.mark.default_shape  # no session: the test process calls the actor
async def test_each_restart_under_a_call_is_waited_for_afresh(runtime: Runtime, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A call whose actor's process is killed under it twice, further apart than a restart is waited
    for, is answered: the wait bounds each restart, not the call's whole life (a long model call
    through two gateway restarts failed its Turn)."""
    monkeypatch.setattr(gateways, "RESTART_WAIT_SECONDS", 30.0)  # a loaded CI machine's restart has taken over 10 s
    asks = tmp_path / "asks"
    async with _answer_asked(_HeldTwice, asks) as (local, call):
        for asked in (1, 2):

            async def held(count: int = asked) -> bool:
                return asks.exists() and len(asks.read_text().splitlines()) == count

            await eventually(held, timeout=60)
            if asked == 2:
                await asyncio.sleep(gateways.RESTART_WAIT_SECONDS + 1)  # since the first restart
            os.kill(await (await local.handle()).pid.remote(), signal.SIGKILL)
        assert await asyncio.wait_for(call, 120) == 3


class _NeverBack(AnswersApart):
    """Its restarted process never finishes starting."""

    def __init__(self, started: str) -> None:
        super().__init__()
        if Path(started).exists():
            time.sleep(3600)
        Path(started).touch()

    async def pid(self) -> int:
        return os.getpid()

    async def answer(self) -> None:
        await asyncio.sleep(300)


@pytest.mark.default_shape  # no session: the test process calls the actor
async def test_a_call_whose_actor_never_comes_back_fails_after_the_restart_wait(
        runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for a restart is bounded even when the restarted process never finishes starting (Ray
    answers every call to it unavailable, for ever: the readiness poll looped until the test's timeout)."""
    monkeypatch.setattr(gateways, "RESTART_WAIT_SECONDS", 3.0)
    async with _answer_asked(_NeverBack, tmp_path / "started") as (local, call):
        pid = await (await local.handle()).pid.remote()
        await asyncio.sleep(0.5)  # the call is in flight
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ray.exceptions.ActorUnavailableError):
            await asyncio.wait_for(call, 60)


class _CrashedByEachAsk(AnswersApart):
    """Its process dies under every ask, as a gateway would under a call whose reply it cannot hold."""

    def __init__(self, asks: str) -> None:
        super().__init__()
        self.asks = Path(asks)

    async def answer(self) -> None:
        with self.asks.open("a") as file:
            file.write("ask\n")
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.default_shape  # no session: the test process calls the actor
async def test_a_call_that_crashes_its_actor_each_time_is_not_asked_for_ever(
        runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each restart is waited for afresh, so restarts alone would never end a call whose every ask
    kills the process (the node's gateway in a crash loop, each of the node's calls failed with it):
    after its gateway restarted under it ``RESTARTS_PER_CALL`` times, the call fails."""
    monkeypatch.setattr(gateways, "RESTARTS_PER_CALL", 1)  # a restart costs seconds on a loaded machine
    asks = tmp_path / "asks"
    async with _answer_asked(_CrashedByEachAsk, asks) as (_, call):
        with pytest.raises(ray.exceptions.ActorUnavailableError):
            await asyncio.wait_for(call, 120)
    assert len(asks.read_text().splitlines()) == gateways.RESTARTS_PER_CALL + 1


class _AnswersAtOnce(AnswersApart):
    async def answer(self) -> str:
        return "answered"


_ANSWERS_AT_ONCE = answering_actor(_AnswersAtOnce)


@pytest.mark.default_shape  # no session: the test process calls the actor
async def test_a_slow_lookup_of_a_nodes_actor_holds_up_nothing_else_of_its_caller(runtime: Runtime) -> None:
    """Getting or making a node's gateway (or sandbox host) by name is a call to Ray's GCS, which can
    take seconds (a GCS under load or restarting); a process makes it on first use and again after
    its actor died for good. Made on the caller's event loop (a session host's: every session's
    lease renewals and model calls) it held that loop as long: here the loop must run while the
    lookup is under way, and the call then be answered."""
    name = f"asked-{uuid.uuid4().hex[:8]}"
    async with freed_only_by_the_loop() as (hold, held):

        def slow_make(node_id: str) -> Any:
            hold()
            return _ANSWERS_AT_ONCE.options(**node_local_options(name, node_id)).remote()

        local = NodeLocal(slow_make)
        try:
            assert await asyncio.wait_for(gateways.ask(local, "answer"), 60) == "answered"
        finally:
            ray.kill(await local.handle())
    assert held == [True]


@pytest.mark.default_shape  # no session: the test process calls the actor
async def test_callers_that_miss_a_nodes_actor_at_once_share_one_lookup(runtime: Runtime) -> None:
    """A gateway's death sends every call of a session host to look it up again at once: one lookup
    (one thread, one GCS call) serves them all."""
    name = f"asked-{uuid.uuid4().hex[:8]}"
    made: list[str] = []

    def slow_make(node_id: str) -> Any:
        made.append(node_id)
        time.sleep(0.5)  # the calls below all miss meanwhile
        return _ANSWERS_AT_ONCE.options(**node_local_options(name, node_id)).remote()

    local = NodeLocal(slow_make)
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(gateways.ask(local, "answer") for _ in range(20))), 60)
    finally:
        ray.kill(await local.handle())
    assert answers == ["answered"] * 20 and len(made) == 1, made


async def test_a_call_asked_again_of_the_gateway_running_it_is_one_request(runtime: Runtime) -> None:
    """Ray cannot tell a caller whether its call to an unavailable actor ran ("may or may not have
    been executed"), so gateways.call asks again under the call's name. The gateway still running
    that call joins the retry to it, and one that has answered it answers again from the reply it
    keeps: one provider request, one record. Cancelling one of two callers leaves the call to the
    other; another name is another call."""
    gateway = model_gateway()
    marker = f"once-{uuid.uuid4().hex[:8]}"
    run_id = str(uuid.uuid4())

    messages = [{"role": "user", "content": script(say(marker, delay_ms=3000))}]

    def ask(call_id: str) -> Any:
        return gateway.complete_for_run.remote(call_id=call_id, run_id=run_id, model=runtime.settings.default_model,
                                               messages=messages, tools=None)

    async def asked() -> bool:
        return requests_with(runtime.settings, marker) == 1

    call_id = uuid.uuid4().hex
    first = ask(call_id)
    await eventually(asked, timeout=30)
    second = ask(call_id)
    await asyncio.sleep(0.5)  # the retry has reached the gateway before its first caller goes
    ray.cancel(first)
    reply = await second
    assert reply["message"]["content"] == marker
    with pytest.raises((ray.exceptions.TaskCancelledError, asyncio.CancelledError)):
        await first
    assert await ask(call_id) == reply  # its answer was lost on the way: the kept reply
    assert requests_with(runtime.settings, marker) == 1

    assert (await ask(uuid.uuid4().hex))["message"]["content"] == marker
    assert requests_with(runtime.settings, marker) == 2

    async def recorded() -> list[dict[str, Any]]:
        found = await rows(runtime.db, "SELECT error FROM model_calls WHERE run_id = %s", run_id)
        return found if len(found) >= 2 else []

    await eventually(recorded, timeout=10)
    await asyncio.sleep(0.5)  # a third record would have been flushed by now (the gateway writes within 50 ms)
    assert await recorded() == [{"error": None}, {"error": None}]


async def test_a_call_aborted_before_its_reply_is_recorded(runtime: Runtime) -> None:
    """A call cancelled by its only caller (a cancel, a stop) is aborted at the provider, which may
    bill what it generated: it is a row of model_calls, as a failed one is. It left none."""
    gateway = model_gateway()
    marker = f"aborted-{uuid.uuid4().hex[:8]}"
    run_id = str(uuid.uuid4())
    call = gateway.complete_for_run.remote(
        call_id=uuid.uuid4().hex, run_id=run_id, model=runtime.settings.default_model,
        messages=[{"role": "user", "content": script(say(marker, delay_ms=30_000))}], tools=None)
    await eventually(lambda: asyncio.sleep(0, requests_with(runtime.settings, marker) == 1), timeout=30)
    ray.cancel(call)
    with pytest.raises((ray.exceptions.TaskCancelledError, asyncio.CancelledError)):
        await call

    async def recorded() -> list[dict[str, Any]]:
        return await rows(runtime.db, "SELECT model, error, prompt_tokens FROM model_calls WHERE run_id = %s", run_id)

    assert await eventually(recorded, timeout=10) == [
        {"model": runtime.settings.default_model, "error": CALL_ABORTED, "prompt_tokens": 0}]


async def test_a_gone_caller_is_found_while_the_database_does_not_answer(database_url: str) -> None:
    """Whether a caller still runs is the gateway's own look at its node; whether its Run is over is
    a database read, which may hang (a database host gone silent: up to 30 s for the connection to
    be given up). The first was checked only after the second, each round: a dead caller's call went
    on, billed, as long as the database did not answer."""
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    async with tcp_link(database_url) as (tcp_url, passing):
        database = await Database.connect(tcp_url, max_size=1)

        async def silent_database() -> Database:
            return database

        in_flight = _CallsInFlight(silent_database, every=0.05)
        flights: list[_Flight] = []

        async def call() -> None:
            with in_flight.call_of(uuid.uuid4(), _process(child.pid)) as flight:
                flights.append(flight)
                await asyncio.sleep(3600)

        passing.clear()  # the database host goes silent: a read waits for an answer that never comes
        calling = asyncio.create_task(call())
        try:
            await asyncio.sleep(0.5)  # rounds went by, one of them waiting on the database
            assert flights and not flights[0].aborted
            child.kill()
            await child.wait()
            await eventually(lambda: asyncio.sleep(0, calling.done()), timeout=10)
            assert flights[0].aborted == CALLER_GONE
        finally:
            calling.cancel()
            if in_flight._checker is not None:
                in_flight._checker.cancel()
            passing.set()
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
            await database.close()


def _awaits(task: asyncio.Task[Any], name: str) -> bool:
    """Whether ``task`` is suspended in a coroutine named ``name`` (anywhere down its await chain)."""
    coro: Any = task.get_coro()
    while coro is not None and hasattr(coro, "cr_code"):
        if coro.cr_code.co_name == name:
            return True
        coro = coro.cr_await
    return False


async def test_a_call_aborted_after_its_reply_came_is_recorded_with_its_usage(
        database_url: str, db: Database, replay: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider billed a reply that came in full; an abort while its last text deltas were still
    being published (the caller cancelled, its Run over) recorded the call with no usage, and the
    Run's budget never counted what it spent."""
    monkeypatch.setenv("CANOPY_DATABASE_URL", database_url)
    get_settings.cache_clear()
    gateway = AccountedGateway(timeout_seconds=30, retries=0, agent_api_bases=(replay.base_url,))
    model, call_id, run_id = f"drained-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, uuid.uuid4()
    replay.script(model, {"say": "a reply that comes a character at a time", "drip": 0.01})
    watch = {"session_id": str(uuid.uuid4()), "tree_id": str(uuid.uuid4()), "turn_id": str(uuid.uuid4()), "step": 1}
    listener = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        await notifications.listen(listener, DELTA_CHANNEL)
        call = asyncio.create_task(gateway.complete_for_run(
            call_id=call_id, run_id=str(run_id), model=f"openai/{model}", api_base=replay.base_url,
            messages=[{"role": "user", "content": "hi"}], tools=None, watch=watch))
        async with asyncio.timeout(30):
            await anext(listener.notifies())  # the first delta went out at once
        pool = await gateway._database()
        async with contextlib.AsyncExitStack() as held:  # every connection of the gateway's pool, so the
            for _ in range(4):                           # later deltas wait to be published
                await held.enter_async_context(pool.tx())
            shared = gateway._shared._calls[call_id].task
            await eventually(lambda: asyncio.sleep(0, _awaits(shared, "drain")), timeout=30)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
    finally:
        await listener.close()
        await gateway.close()
        get_settings.cache_clear()
    recorded = await rows(db, "SELECT error, prompt_tokens, completion_tokens FROM model_calls WHERE run_id = %s",
                          run_id)
    assert recorded == [{"error": CALL_ABORTED, "prompt_tokens": 11, "completion_tokens": 7}]


async def test_each_node_calls_its_own_gateway_and_survives_the_heads_dying(own_database_url: str,
                                                                             tmp_path: Path) -> None:
    # Each session's one Run must not be recovered either: on a loaded CI machine a session process of
    # the two-node cluster once missed the tests' 4 s lease, and its Turn ran in a second Run.
    findings = await scenario_findings("tests.actors.gateways_scenario", {
        **RUNTIME_ENV, **PINNED_ENV, "CANOPY_LEASE_SECONDS": "20", "CANOPY_DATA_DIR": str(tmp_path),
        "SCENARIO_DATABASE_URL": own_database_url}, timeout=240)

    head, other = findings["head"], findings["other"]
    assert head != other
    # Where each session's Run executed (Ray's actor table) is where its model calls were made.
    assert findings["session_nodes"] == {"on_head": head, "on_other": other}, findings
    assert findings["run_owners"] == {"on_head": [True], "on_other": [True]}, findings  # one Run each, in that actor
    assert findings["call_nodes"] == {"on_head": [head], "on_other": [other]}, findings
    # A gateway lives on each node that ran a session, pinned there under the node's name.
    assert findings["gateways"] == {head: f"canopy:gateway:{head}", other: f"canopy:gateway:{other}"}, findings
    assert findings["gateway_malloc_arenas"] == {head: MALLOC_ARENA_MAX, other: MALLOC_ARENA_MAX}, findings
    # The head's gateway was killed during the head session's call: asked again, the Turn completed, charged once.
    assert findings["results"] == {"on_head": ["completed", findings["head_marker"]],
                                   "on_other": ["completed", "other done"]}, findings
    assert findings["killed_gateway_replaced"] is True
    assert findings["head_requests"] == 2
    assert findings["charged"] == {"on_head": 1, "on_other": 1}


class Reply(dict[str, Any]):
    """A reply as a gateway returns it, which a weak reference can follow (a dict cannot be one's)."""


async def test_replies_kept_for_retries_hold_at_most_their_budget_the_oldest_forgotten_first() -> None:
    """A gateway keeps each call's reply 90 s for a retry whose first answer was lost; a reply may hold
    a million characters, and nothing bounded what a busy node's gateway kept meanwhile. Past the
    budget the oldest replies are forgotten: a retry of one asks the model again, of a newer one not."""
    shared = _SharedCalls(keep_seconds=90, max_kept_chars=1_000, size=_reply_chars)
    asked: list[str] = []
    replies: list[weakref.ref[Reply]] = []

    def call(key: str, chars: int) -> Any:
        async def start() -> Reply:
            asked.append(key)
            reply = Reply(message={"content": "x" * chars, "tool_calls": []}, model="m")
            replies.append(weakref.ref(reply))
            return reply
        return shared.run(key, start)

    for index in range(10):
        await call(f"c{index}", 298)  # 300 characters a reply, its empty tool calls included
    gc.collect()
    assert [ref() is not None for ref in replies] == [False] * 7 + [True] * 3  # the forgotten ones are freed
    asked.clear()
    for index in reversed(range(10)):  # newest first: a retry asked again ends, and is kept, in its turn
        await call(f"c{index}", 298)
    assert asked == [f"c{index}" for index in reversed(range(7))], asked  # the last three (900) were kept


def test_a_caller_runs_until_its_process_ends_whoever_has_its_pid_then(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call's caller is its pid and start time: a process on a reused pid, or one dead but not yet
    reaped (a zombie), is not it. The start is counted from the machine's boot: a start time in wall
    clock moves with the clock (psutil adds /proc/stat's whole-second boot time, which NTP's step or
    a VM's resume changes), and every live caller on the node looked gone, its call aborted."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    caller = _process(child.pid)
    assert caller is not None
    try:
        assert _runs(caller)
        assert not _runs((caller[0], child.pid, caller[2] - 1))  # another process started on that pid
        stepped = psutil._pslinux.boot_time() + 1  # type: ignore[attr-defined]  # the wall clock stepped
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: stepped)  # type: ignore[attr-defined]
        assert _runs(caller) and _runs(this_process())
        monkeypatch.undo()
        child.kill()
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        assert not _runs(caller)
    finally:
        child.kill()
        child.wait()
    assert not _runs(caller)


async def test_a_call_is_aborted_when_its_caller_is_gone_and_only_a_caller_of_this_machine() -> None:
    """The gateway aborts a call whose caller, a process of its own machine (boot and pid namespace),
    is gone: found gone later, or already at the call's start (it died while its call waited for a
    slot of the gateway). A caller of another machine or pid namespace, whose pid says nothing here,
    is left to its Run's lease, never taken for gone."""
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    ended = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    ended_caller = _process(ended.pid)
    await ended.wait()
    in_flight = _CallsInFlight(database=None, every=3600)  # type: ignore[arg-type]  # no round, no database
    flights: dict[str, _Flight] = {}

    async def call(name: str, caller: Caller | None) -> None:
        with in_flight.call_of(uuid.uuid4(), caller) as flight:
            flights[name] = flight
            await asyncio.sleep(3600)

    seen = _process(child.pid)
    assert seen is not None and ended_caller is not None
    try:
        calls = [asyncio.create_task(call("seen", seen)),
                 asyncio.create_task(call("elsewhere", ("another-boot/pid:[1]", *seen[1:]))),
                 asyncio.create_task(call("gone before", ended_caller)),
                 asyncio.create_task(call("ours", this_process()))]
        await asyncio.sleep(0.1)
        assert {name: flight.aborted for name, flight in flights.items()} == {
            "seen": None, "elsewhere": None, "gone before": CALLER_GONE, "ours": None}
        child.kill()
        await child.wait()
        in_flight._abort_calls_of_gone_callers()
        await asyncio.sleep(0.1)
        assert {name: (flight.aborted, flight.task.done()) for name, flight in flights.items()} == {
            "seen": (CALLER_GONE, True), "elsewhere": (None, False), "gone before": (CALLER_GONE, True),
            "ours": (None, False)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        for task in [*calls, in_flight._checker]:
            task.cancel()  # type: ignore[union-attr]
