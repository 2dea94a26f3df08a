"""Fan-out benchmark: a root creates N children, each does K model steps of L ms.

Prints the makespan, the ideal ceil(N/slots)·K·L (plus the root's own steps), their
ratio, the runtime overhead per model step at L = 0 beside the model client's own floor (the
same call through litellm in one process), the peak of live session actors, and the peak memory
of this runtime's processes (the driver, every Ray process it started — the dashboard too, as
``canopy up`` runs it — and the embedded PostgreSQL; other Ray clusters on the machine are not
counted) with where it went by process kind at that peak, and the RSS of a session process idle
after the fan-out (a dedicated session actor, or a host).

Memory is summed two ways. RSS counts a page shared by several processes once in each of them:
PostgreSQL's shared buffers in every backend, the dashboard's modules forked from one process,
the libraries every Ray worker maps. PSS (proportional set size) splits each shared page among
its sharers, so its sum is the memory the runtime really holds; it is read at the peak of RSS
(within 2 %).

    python bench/fanout.py --children 12 --steps 3 --latency-ms 200 [--profile]

The fan-out at L runs ``--repeat`` times (default 3) after a small warm-up tree; the
makespan is their median, and each is printed (the first after start pays one-time costs:
prepared statements, first code paths). ``--profile`` adds a timeline of the root and the
children from the durable facts: how long a Run waited for its slot, how long from its
grant to its first model call (activation), the overhead between model calls, how long a
freed slot stayed empty, the critical path (the chain of Runs that decided the makespan, each
model call's start and end on it), and the CPU each kind of process used. ``FANOUT_PS=1``
also lists every process of the runtime. ``--quick`` skips the warm-up and the run at L = 0
(for a wide fan-out such as ``--children 500 --steps 2 --latency-ms 2000 --repeat 1``).
``--settle`` waits before each measured fan-out until the sessions of the earlier ones (and, in the
dedicated shape, their processes and supervisors) have passivated, which the SPEC lets take
``actor_idle_seconds`` (60 s): the memory figures are then one tree's, not those of one tree beside
the idle processes of the trees before it.
The root's steps (its create replies of at most 32 calls, a wait per hundred children, the
summary: three for twelve children) take L each, as the ideal assumes (the first version of this
benchmark ran them at 0 ms: ``--root-latency-ms 0`` reproduces that).

Shapes (environment, actors/placement.py): ``CANOPY_SESSION_HOSTS=N`` runs sessions in N shared
hosts (the default, 2), ``CANOPY_SESSION_HOSTS=0`` a process each.

``--nodes 3`` runs the same on a simulated cluster of that many nodes on this machine
(``ray.cluster_utils.Cluster``, ``--node-cpus`` each; the database is started first, so it is
the one of this machine that every node reaches) with ``CANOPY_SESSION_SPREAD`` (default here:
spread), and prints how many members of the measured tree ran on each node (Ray's actor table:
a member counts once on every node it ran on). Its peak live sessions are then the head node's
only (each node's directory counts its own).
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import itertools
import math
import os
import statistics
import tempfile
import threading
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import psutil
import ray
from pydantic import SecretStr
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from actors.tools import MAX_WAIT_IDS
from persistence.databases import rows
from persistence.db import resolve_database_url
from persistence.records import Scope
from persistence.settings import Settings

# A reply holds at most this many tool calls (the max_tool_calls_per_reply setting's default): a
# wider fan-out creates its children over several replies.
CREATES_PER_REPLY = Settings().max_tool_calls_per_reply
# Children whose scripts the root's input holds inline (about 250 characters each).
INLINE_CHILDREN = 200


def compile_bytecode() -> None:
    """Write the bytecode of Canopy's own modules, as installing the wheel does (pip compiles what it
    installs). A checkout run with ``PYTHONDONTWRITEBYTECODE`` set (as on the machine these figures
    come from) has none, and every worker process the runtime starts would compile Canopy's modules
    from source again: ~0.1 s of CPU each, a cost no deployment pays (README: Benchmarks). The
    packages are those pyproject.toml ships."""
    root = Path(__file__).resolve().parent.parent
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in sorted({name.split(".")[0] for name in packages}):
        compileall.compile_dir(root / package, quiet=1)


def root_steps(children: int) -> int:
    """The root's model steps: its create replies, its waits, the summary (and the template's two)."""
    template = 2 if children > INLINE_CHILDREN else 0
    return template + math.ceil(children / CREATES_PER_REPLY) + math.ceil(children / MAX_WAIT_IDS) + 1


# Sampling every process costs CPU on a small machine: often enough for the peaks, no more.
SAMPLE_SECONDS = 0.25
# The by-kind figures (PSS among them) are read again when the RSS passes the RSS of their last
# reading by this factor: at every new peak they would be read at nearly every sample, as RSS creeps up.
PSS_READ_STEP = 1.02
# Ray titles an actor's process ray::<class>, or ray::<task name> while a named task runs.
SESSION_PROCESSES = ("SessionActorImpl", "SessionHostImpl", "ray::session:")
# The processes a tree leaves behind idle in the dedicated shape, until they passivate.
TREE_PROCESSES = ("SessionActorImpl", "TreeSupervisorImpl", "ray::session:", "ray::tree:")


def child_script(steps: int, latency_ms: int) -> str:
    work = [call(("list_agents", {}), delay_ms=latency_ms) for _ in range(steps - 1)]
    return script(*work, say("done", delay_ms=latency_ms))


def root_script(children: int, steps: int, latency_ms: int, root_latency_ms: int) -> str:
    """The root's script. Its steps take L each by default, as the ideal counts them.

    Up to ``INLINE_CHILDREN`` the children's scripts are written into the root's input, one per
    create. A wider fan-out would not fit an input (``persistence.turns.MAX_TEXT``), so the root
    first creates a ``template`` member whose reply, at once, is the children's script, waits for
    it, and hands that reply to every create by reference (two more root steps, one more member).
    """
    child = child_script(steps, latency_ms)
    if children > INLINE_CHILDREN:
        first = 2  # the template's create and wait come first
        description = "${1.results.0.output}"
        before = [call(create("template", script(say(child))), delay_ms=root_latency_ms),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]}), delay_ms=root_latency_ms)]
    else:
        first, description, before = 0, child, []
    creates = [create(f"c{i}", description) for i in range(children)]
    return script(
        *before,
        # The creates come first after it, so call first + i of the Turn is child i's create.
        *(call(*creates[start:start + CREATES_PER_REPLY], delay_ms=root_latency_ms)
          for start in range(0, children, CREATES_PER_REPLY)),
        # A wait names at most MAX_WAIT_IDS inputs: one wait step per hundred children.
        *(call(("wait_inputs", {"input_ids": [f"${{{first + i}.input_id}}"
                                              for i in range(start, min(start + MAX_WAIT_IDS, children))]}),
               delay_ms=root_latency_ms)
          for start in range(0, children, MAX_WAIT_IDS)),
        say("summary", delay_ms=root_latency_ms),
    )


class Sampler:
    """Samples live session actors and the RSS of this runtime's processes every SAMPLE_SECONDS."""

    def __init__(self, data_dir: Path) -> None:
        self.pg_dir = str(data_dir / "pg")
        from actors.directory import directory_handle

        self.directory = directory_handle()
        self.peak_rss = 0
        self.peak_sessions = 0  # processes running sessions (dedicated actors or shared hosts)
        self.peak_live = 0  # live sessions, as the node's directory counts them
        self.peak_by_kind: dict[str, list[int]] = {}  # near the peak RSS: kind -> [processes, RSS, PSS]
        self._by_kind_rss = 0  # the RSS when peak_by_kind was read
        self._cpu_first: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._kind: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_seconds(self) -> float:
        """CPU time the runtime's processes used while sampled (processes that exited count up to their
        last sample; a process seen once counts its whole life, as it started during the run)."""
        return sum(self._cpu_last[pid] - self._cpu_first.get(pid, 0.0) for pid in self._cpu_last)

    def cpu_by_kind(self) -> dict[str, float]:
        kinds: dict[str, float] = {}
        for pid, last in self._cpu_last.items():
            kind = self._kind.get(pid, "?")
            kinds[kind] = kinds.get(kind, 0.0) + last - self._cpu_first.get(pid, 0.0)
        return dict(sorted(kinds.items(), key=lambda item: -item[1]))

    def sample(self) -> tuple[int, int, list[tuple[psutil.Process, str, int]]]:
        """The RSS of the runtime's processes, the number that run sessions, and (process, kind, RSS) each."""
        rss = sessions = 0
        seen: list[tuple[psutil.Process, str, int]] = []
        first = not self._cpu_last
        for proc in runtime_processes(self.pg_dir):
            try:
                used_memory = proc.memory_info().rss
                times = proc.cpu_times()
                used = times.user + times.system
                if first:
                    self._cpu_first[proc.pid] = used
                self._cpu_last[proc.pid] = used
                if self._kind.get(proc.pid, "ray worker").startswith("ray worker"):
                    self._kind[proc.pid] = _kind(proc)
                kind = self._kind[proc.pid]
                if runs_sessions(proc):
                    sessions += 1
                    kind = "session process"
            except psutil.Error:
                continue
            rss += used_memory
            seen.append((proc, kind, used_memory))
        return rss, sessions, seen

    @staticmethod
    def by_kind(seen: list[tuple[psutil.Process, str, int]]) -> dict[str, list[int]]:
        """kind -> [processes, RSS, PSS]. Reading a PSS walks the process's page tables (a few ms for a
        large one): done only near a new peak, so that sampling does not take the CPU it measures."""
        kinds: dict[str, list[int]] = {}
        for proc, kind, rss in seen:
            try:
                pss = proc.memory_full_info().pss
            except psutil.Error:
                continue
            counted = kinds.setdefault(kind, [0, 0, 0])
            counted[0] += 1
            counted[1] += rss
            counted[2] += pss
        return kinds

    @property
    def pss_at_peak(self) -> int:
        return sum(pss for _, _, pss in self.peak_by_kind.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, sessions, seen = self.sample()
            if rss > self._by_kind_rss * PSS_READ_STEP:
                self.peak_by_kind, self._by_kind_rss = self.by_kind(seen), rss
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_sessions = max(self.peak_sessions, sessions)
            try:
                import ray

                live = ray.get(self.directory.stats.remote(), timeout=2)["live"]
                self.peak_live = max(self.peak_live, live)
            except Exception:
                pass
            self._stop.wait(SAMPLE_SECONDS)


def runtime_processes(pg_dir: str) -> list[psutil.Process]:
    """This process, every process it started (Ray's), and the PostgreSQL serving ``pg_dir``."""
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and "postgres" in cmd[0] and pg_dir in " ".join(cmd):
            procs.append(proc)
            procs.extend(proc.children())
    return procs


def runs_sessions(proc: psutil.Process) -> bool:
    """Whether ``proc`` runs sessions (a dedicated session actor or a host)."""
    return _titled(proc, SESSION_PROCESSES)


async def settle(data_dir: Path, timeout: float) -> float:
    """Wait until no session is live (the node's directory counts none) and no dedicated session or
    supervisor process is left: what earlier fan-outs left idle has passivated. Seconds waited."""
    from actors.directory import directory_handle

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        live = (await directory_handle().stats.remote())["live"]
        left = [proc for proc in runtime_processes(str(data_dir / "pg")) if _titled(proc, TREE_PROCESSES)]
        if not live and not left:
            return time.monotonic() - started
        await asyncio.sleep(1)
    raise TimeoutError(f"sessions still live after {timeout:.0f} s")


def _titled(proc: psutil.Process, names: tuple[str, ...]) -> bool:
    try:
        return any(name in " ".join(proc.cmdline()) for name in names)
    except psutil.Error:
        return False


def idle_session_rss(data_dir: Path) -> list[int]:
    """The RSS of each process that runs sessions, sampled once while none has work."""
    found = []
    for proc in runtime_processes(str(data_dir / "pg")):
        try:
            if runs_sessions(proc):
                found.append(proc.memory_info().rss)
        except psutil.Error:
            continue
    return found


def _kind(proc: psutil.Process) -> str:
    argv = proc.cmdline()
    cmd = " ".join(argv)
    if cmd.startswith("ray::"):
        return cmd.split()[0].split(".")[0]
    if cmd.startswith("ray-dashboard-"):
        return "dashboard module"  # the dashboard's head modules, forked from one process
    program = Path(argv[0]).name if argv else ""
    if program in ("gcs_server", "raylet"):  # the raylet's arguments name the worker script
        return program
    if "default_worker" in cmd:
        return "ray worker (starting)"
    # The forkserver's command line names the dashboard's modules it forks: it is matched first.
    for marker in ("forkserver", "dashboard", "runtime_env", "log_monitor", "monitor.py", "resource_tracker",
                   "postgres"):
        if marker in cmd:
            return marker
    return "driver" if proc.pid == os.getpid() else cmd[:40]


async def one(
    runtime: Runtime, data_dir: Path, children: int, steps: int, latency_ms: int, root_latency_ms: int | None = None
) -> tuple[float, Sampler, uuid.UUID]:
    """One fan-out; its makespan is read from the committed facts: from the root input's
    creation to the end of its Turn (so how often this process polls does not matter)."""
    root_latency_ms = latency_ms if root_latency_ms is None else root_latency_ms
    scope = Scope(f"bench-{uuid.uuid4().hex[:6]}", "bench")
    with Sampler(data_dir) as sampler:
        created = await runtime.create_root(scope, input_text=root_script(children, steps, latency_ms, root_latency_ms))
        result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=900, poll_seconds=0.1)
    assert result["status"] == "completed", result
    span = await rows(runtime.db, """
        SELECT EXTRACT(EPOCH FROM t.ended_at - i.created_at)::float8 AS seconds
        FROM inputs i JOIN turns t USING (input_id) WHERE i.input_id = %s""", created["input"]["input_id"])
    return span[0]["seconds"], sampler, created["session"]["session_id"]


async def recorded_calls(runtime: Runtime, tree_id: uuid.UUID, expected: int) -> None:
    """Wait (briefly) for the gateway's model-call records, which it writes shortly after each reply."""
    for _ in range(50):
        found = await rows(runtime.db, "SELECT count(*) AS n FROM model_calls m JOIN runs r USING (run_id) "
                           "WHERE r.tree_id = %s", tree_id)
        if found[0]["n"] >= expected:
            return
        await asyncio.sleep(0.1)


async def profile(runtime: Runtime, tree_id: uuid.UUID, model_steps: int) -> None:
    """A timeline of the children's Runs, from committed timestamps (ms)."""
    await recorded_calls(runtime, tree_id, model_steps)
    runs = await rows(
        runtime.db,
        """
        SELECT r.run_id, r.session_id, r.queued_at, r.started_at, r.ended_at, s.path
        FROM runs r JOIN sessions s USING (session_id)
        WHERE r.tree_id = %s AND s.parent_id IS NOT NULL ORDER BY r.started_at""",
        tree_id,
    )
    calls = await rows(
        runtime.db,
        """
        SELECT m.run_id, m.created_at - make_interval(secs => m.latency_ms / 1000) AS call_start,
               m.created_at AS call_end, m.latency_ms
        FROM model_calls m JOIN runs r USING (run_id) WHERE r.tree_id = %s ORDER BY m.id""",
        tree_id,
    )
    by_run: dict[Any, list[dict[str, Any]]] = {}
    for c in calls:
        by_run.setdefault(c["run_id"], []).append(c)

    def ms(delta: Any) -> float:
        return delta.total_seconds() * 1000

    slot_wait, activation, between, tail, latency = [], [], [], [], []
    for run in runs:
        mine = sorted(by_run.get(run["run_id"], []), key=lambda c: c["call_start"])
        if not mine or run["started_at"] is None:
            continue
        slot_wait.append(ms(run["started_at"] - run["queued_at"]))
        activation.append(ms(mine[0]["call_start"] - run["started_at"]))
        between.extend(ms(b["call_start"] - a["call_end"]) for a, b in itertools.pairwise(mine))
        latency.extend(c["latency_ms"] for c in mine)
        if run["ended_at"] is not None:
            tail.append(ms(run["ended_at"] - mine[-1]["call_end"]))
    ends = sorted(r["ended_at"] for r in runs if r["ended_at"] is not None)
    starts = sorted(r["started_at"] for r in runs if r["started_at"] is not None)
    # A freed slot: from a Run's end to the next grant after it (while Runs are still queued).
    refill = [ms(next(s for s in starts if s >= e) - e) for e in ends if any(s >= e for s in starts)]

    def line(name: str, values: list[float]) -> None:
        if values:
            print(
                f"  {name:34s} n={len(values):3d} mean {statistics.mean(values):7.1f}  "
                f"median {statistics.median(values):7.1f}  max {max(values):7.1f} ms"
            )

    root_runs = await rows(runtime.db, """
        SELECT r.run_id, r.kind, r.queued_at, r.started_at, r.ended_at FROM runs r
        WHERE r.session_id = %s ORDER BY r.queued_at""", tree_id)
    children_ended = max((r["ended_at"] for r in runs if r["ended_at"] is not None), default=None)
    print("profile (root):")
    for run in root_runs:
        mine = sorted(by_run.get(run["run_id"], []), key=lambda c: c["call_start"])
        first = ms(mine[0]["call_start"] - run["started_at"]) if mine and run["started_at"] else float("nan")
        since = (f"last child ended -> queued {ms(run['queued_at'] - children_ended):7.1f}"
                 if run["kind"] == "resume" and children_ended else "")
        print(f"  {run['kind']:6s} queued -> granted {ms(run['started_at'] - run['queued_at']):7.1f}  "
              f"granted -> 1st call {first:7.1f}  {since} ms")
    critical_path(runs, root_runs, by_run)
    print("profile (children):")
    line("slot wait (queued -> granted)", slot_wait)
    line("activation (granted -> 1st call)", activation)
    line("model call latency (gateway)", latency)
    line("between model calls", between)
    line("tail (last call -> run ended)", tail)
    line("slot refill (run ended -> grant)", refill)


def critical_path(children: list[dict[str, Any]], root_runs: list[dict[str, Any]],
                  calls: dict[Any, list[dict[str, Any]]]) -> None:
    """The chain of Runs that decided the makespan, in ms from the root's grant: the root's first
    Run, then backwards from the child that ended last, each child whose end freed the next
    one's slot. Per Run: its grant, each model call's start and end, its end."""
    start, resume = root_runs[0], root_runs[-1]
    finished = [r for r in children if r["ended_at"] is not None and r["started_at"] is not None]
    chain = [max(finished, key=lambda r: r["ended_at"])]
    while True:
        before = [r for r in [*finished, start] if r["ended_at"] <= chain[-1]["started_at"]]
        if not before:
            break
        chain.append(max(before, key=lambda r: r["ended_at"]))
        if chain[-1] is start:
            break
    t0 = start["started_at"]

    def at(moment: Any) -> str:
        return f"{(moment - t0).total_seconds() * 1000:7.1f}"

    print("critical path (ms from the root's grant; call start-end):")
    for run in [*reversed(chain), resume]:
        spans = " ".join(f"[{at(c['call_start'])}-{at(c['call_end'])}]"
                         for c in sorted(calls.get(run["run_id"], []), key=lambda c: c["call_start"]))
        name = run.get("path") or f"root {run['kind']}"
        ended = at(run["ended_at"]) if run["ended_at"] is not None else "   open"
        print(f"  {name:14s} granted {at(run['started_at'])} {spans} ended {ended}")


def sessions_per_node(runtime: Runtime, members: list[uuid.UUID]) -> dict[str, int]:
    """How many of ``members`` ran on each node: the nodes Ray's actor table (dead actors
    included) gives for the actor that runs each (its own, or its host)."""
    nodes: dict[str, set[str]] = {}
    address = ray.get_runtime_context().gcs_address
    for actor in list_actors(address=address, limit=10_000, raise_on_missing_output=False):
        if actor.name:
            nodes.setdefault(actor.name, set()).add(actor.node_id)
    counts: dict[str, int] = {}
    for member in members:
        for node in nodes.get(runtime.placement.actor_name(member), ()):
            counts[node] = counts.get(node, 0) + 1
    return counts


async def model_client_floor(calls: int = 100, rounds: int = 3) -> float:
    """Milliseconds per model call of a ModelGateway in this process, the scripted model at 0 ms:
    what litellm's Router and the local HTTP model cost on their own, the part of a model step at
    L = 0 that is not Canopy's (imports litellm here: call it after the last sample). The best of
    ``rounds``: a floor, which the runtime's idle processes can only raise."""
    from actors.model_gateway import ModelGateway

    gateway = ModelGateway()
    request = {"model": "canopy/scripted", "tools": None,
               "messages": [{"role": "user", "content": child_script(3, 0)}]}
    try:
        for _ in range(20):  # the first calls pay imports and connection setup
            await gateway.complete(**request)
        best = math.inf
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(calls):
                await gateway.complete(**request)
            best = min(best, (time.perf_counter() - started) / calls * 1000)
        return best
    finally:
        await gateway.close()


def simulated_cluster(nodes: int, cpus: int) -> Cluster:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": True,
                                                            "dashboard_host": "127.0.0.1", "dashboard_port": None})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    return cluster


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument(
        "--root-latency-ms",
        type=int,
        default=None,
        help="latency of the root's 3 steps (default: L, as the ideal assumes; "
        "the first version of this benchmark used 0)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--repeat", type=int, default=3,
                        help="measured fan-outs at L; the makespan reported is their median (the first "
                             "after start is printed too: it pays one-time costs)")
    parser.add_argument("--quick", action="store_true",
                        help="no warm-up fan-out and no run at L=0 (for a wide fan-out, where each would take "
                             "longer than the measured run)")
    parser.add_argument("--settle", action="store_true",
                        help="before each measured fan-out, wait until the sessions of the earlier ones have "
                             "passivated (actor_idle_seconds): the memory of one tree, not of several")
    parser.add_argument("--nodes", type=int, default=1, help="a simulated Ray cluster of this many nodes")
    parser.add_argument("--node-cpus", type=int, default=1, help="CPUs of each simulated node")
    args = parser.parse_args()
    compile_bytecode()
    with tempfile.TemporaryDirectory() as data_dir:
        os.environ["CANOPY_DATA_DIR"] = data_dir
        settings = Settings(data_dir=Path(data_dir))
        cluster = None
        if args.nodes > 1:
            os.environ.setdefault("CANOPY_SESSION_SPREAD", "spread")
            url = resolve_database_url(settings)  # before the cluster: the embedded server of this machine
            cluster = simulated_cluster(args.nodes, args.node_cpus)
            settings = Settings(data_dir=Path(data_dir), ray_address=cluster.address, database_url=SecretStr(url))
        runtime = await Runtime.start(settings, include_dashboard=True)  # as `canopy up` runs it
        slots = settings.tree_slots
        # Warm up at full size and L=0: the session hosts' pooled connections, the statements
        # they prepare, litellm, the actors. The figures below are the steady state's.
        if not args.quick:
            await one(runtime, Path(data_dir), args.children, args.steps, 0)
        measured, settled = [], []
        for _ in range(max(1, args.repeat)):
            if args.settle:
                settled.append(await settle(Path(data_dir), timeout=3 * settings.actor_idle_seconds + 60))
            measured.append(await one(runtime, Path(data_dir), args.children, args.steps, args.latency_ms,
                                      args.root_latency_ms))
        makespans = [m[0] for m in measured]
        makespan, sampler, tree = sorted(measured, key=lambda m: m[0])[len(measured) // 2]
        if args.profile:
            await profile(runtime, tree, args.children * args.steps + root_steps(args.children))
        ideal = (math.ceil(args.children / slots) * args.steps + root_steps(args.children)) * args.latency_ms / 1000
        idle = idle_session_rss(Path(data_dir))  # the fan-out's sessions are done; their processes linger
        zero_run = None if args.quick else await one(runtime, Path(data_dir), args.children, args.steps, 0)
        if zero_run is not None and args.profile:
            print("at L=0:")
            await profile(runtime, zero_run[2], args.children * args.steps + root_steps(args.children))
        model_steps = args.children * args.steps + root_steps(args.children)
        root_ms = args.latency_ms if args.root_latency_ms is None else args.root_latency_ms
        shape = type(runtime.placement).__name__.lower()
        print(f"placement={shape} session_hosts={settings.session_hosts} nodes={args.nodes} "
              f"session_spread={settings.session_spread}")
        print(
            f"children={args.children} steps={args.steps} latency={args.latency_ms}ms root={root_ms}ms slots={slots} "
            f"max_live_sessions={settings.max_live_sessions}"
        )
        print(f"makespan            {makespan:8.2f} s   (median of {', '.join(f'{m:.2f}' for m in makespans)})")
        if settled:
            print(f"settled             each measured fan-out started with no session live (waited "
                  f"{', '.join(f'{w:.0f}' for w in settled)} s)")
        print(f"ideal               {ideal:8.2f} s   (ceil(N/{slots})*K*L + root steps)")
        print(f"ratio               {makespan / ideal:8.2f} x ideal" if ideal else "ratio                 n/a (L=0)")
        if zero_run is not None:
            zero = zero_run[0]
            print(f"overhead at L=0     {zero / model_steps * 1000:8.1f} ms per model step "
                  f"({zero:.2f} s for {model_steps} steps)")
        if idle:
            print(f"idle session process RSS  median {statistics.median(idle) / 2**20:.0f} MiB, "
                  f"max {max(idle) / 2**20:.0f} MiB ({len(idle)} processes)")
        runs = [("L", sampler)] + ([] if zero_run is None else [("L=0", zero_run[1])])
        for name, s in runs:
            print(
                f"run at {name:4s}  peak live sessions {s.peak_live:4d}   session processes {s.peak_sessions:4d}   "
                f"peak RSS {s.peak_rss / 2**20:6.0f} MiB   PSS then {s.pss_at_peak / 2**20:6.0f} MiB   "
                f"CPU used {s.cpu_seconds:6.1f} s"
            )
            print("  at the peak RSS, by process kind (processes x RSS = RSS, PSS):", ", ".join(
                f"{kind} {count} x {rss / count / 2**20:.0f} = {rss / 2**20:.0f}, {pss / 2**20:.0f} MiB"
                for kind, (count, rss, pss) in sorted(s.peak_by_kind.items(), key=lambda item: -item[1][1])))
            if args.profile:
                print("  CPU by process:", ", ".join(f"{k} {v:.2f}" for k, v in s.cpu_by_kind().items() if v >= 0.01))
        if cluster is not None:
            members = [m["session_id"] for m in await rows(
                runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s", tree)]
            per_node = sessions_per_node(runtime, members)
            head = cluster.head_node.node_id
            print(f"members per node    {len(members)} members of the measured tree: " + ", ".join(
                f"{node[:8]}{' (head)' if node == head else ''} {per_node.get(node, 0)}"
                for node in [head, *sorted(n.node_id for n in cluster.worker_nodes)]))
        if os.environ.get("FANOUT_PS"):
            for proc in psutil.Process().children(recursive=True):
                try:
                    t = proc.cpu_times()
                    print(f"  {proc.pid:7d} {proc.create_time() - time.time():7.1f}s cpu {t.user + t.system:5.2f} "
                          f"rss {proc.memory_info().rss / 2**20:5.0f} {' '.join(proc.cmdline())[:60]}")
                except psutil.Error:
                    pass
        if not args.quick:
            floor = await model_client_floor()
            print(f"model client floor  {floor:8.1f} ms per call (the same scripted call through litellm's Router, "
                  "in one process: no Ray, no database)")
        await runtime.close(shutdown_ray=True)
        if cluster is not None:
            cluster.shutdown()
        if not Settings().database_url:
            from persistence.embedded import stop_embedded

            stop_embedded(Path(data_dir))  # the embedded server outlives its starter otherwise


if __name__ == "__main__":
    asyncio.run(main())
