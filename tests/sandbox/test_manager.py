"""The lease protocol of ``SandboxManager`` against both backends: no transaction open while a
sandbox is built or removed, waits instead of duplicates, and recovery from a process that died
between announcing sandbox work and settling it. Crashes are played by writing the lease row a
dead process would have left (its ``updated_at`` older than the takeover bound)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path

import pytest

from persistence import sandbox_leases as leases
from persistence.sandbox_leases import TRANSITION_STALE_SECONDS, SandboxLease
from sandbox.base import SandboxError, SandboxMoved, ScopeFull
from sandbox.manager import SandboxManager
from tests.sandbox.conftest import (
    GatedBackend,
    SandboxKit,
    insert_running_run,
    last_used,
    made_room,
    open_transactions,
)


async def _lease(kit: SandboxKit, tree: uuid.UUID) -> SandboxLease | None:
    async with kit.db.tx() as conn:
        return await leases.get(conn, tree)


async def _leave_lease(kit: SandboxKit, tree: uuid.UUID, state: str, handle: str | None, age: float) -> None:
    """The lease row as a process that announced ``state`` ``age`` seconds ago and then died left it."""
    async with kit.db.tx() as conn:
        await conn.execute(
            "UPDATE sandbox_leases SET state = %s, handle = %s, updated_at = now() - make_interval(secs => %s) "
            "WHERE tree_id = %s",
            (state, handle, age, tree),
        )


async def _sandboxes_of(kit: SandboxKit, tree: uuid.UUID) -> list[str]:
    """The tree's sandboxes the backend has (an engine may hold other tests' too)."""
    return [handle for handle, owner in (await kit.backend.sandboxes()).items() if owner == tree]


async def _marker(manager: SandboxManager, tree: uuid.UUID, workdir: Path) -> str:
    result = await manager.run_command(tree, workdir, 'test -e "$CANOPY_TMP/m" && echo old || echo fresh', 30)
    return result.stdout.strip()


async def test_no_transaction_is_open_while_a_sandbox_is_built(sandbox: SandboxKit) -> None:
    gated = GatedBackend(sandbox.backend, "ensure")
    first, second = (SandboxManager(sandbox.db, gated, 300, sandbox.options) for _ in range(2))
    tree, workdir = await sandbox.new_tree()

    claim = asyncio.create_task(first.claim(tree, workdir))
    await asyncio.wait_for(gated.entered.wait(), 30)
    await asyncio.sleep(0.5)  # a transaction held across ensure would be this old by now
    during = await open_transactions(sandbox.db)
    lease = await _lease(sandbox, tree)
    # Another claim meanwhile waits for the one in progress, holding no transaction either.
    waiting = asyncio.create_task(second.claim(tree, workdir))
    await asyncio.sleep(0.5)
    while_waiting = await open_transactions(sandbox.db)
    waited = not waiting.done()
    gated.gate.set()
    handles = await asyncio.wait_for(asyncio.gather(claim, waiting), 30)

    assert during == [] and while_waiting == []
    assert lease is not None and (lease.state, lease.handle) == ("creating", None)
    assert waited and handles[0] == handles[1]
    assert gated.calls["ensure"] == 1  # the waiting claim used what the first one built
    after = await _lease(sandbox, tree)
    assert after is not None and (after.state, after.handle) == ("active", handles[0])


async def test_a_sandbox_being_built_is_not_reaped(sandbox: SandboxKit) -> None:
    gated = GatedBackend(sandbox.backend, "ensure")
    tree, workdir = await sandbox.new_tree()
    claim = asyncio.create_task(SandboxManager(sandbox.db, gated, 300, sandbox.options).claim(tree, workdir))
    await asyncio.wait_for(gated.entered.wait(), 30)

    reaped = await sandbox.manager().reap_orphans()
    gated.gate.set()
    handle = await asyncio.wait_for(claim, 30)

    assert handle not in reaped
    assert await sandbox.backend.exists(handle)


async def test_a_stalled_release_is_finished_by_the_next_claim(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await manager.run_command(tree, workdir, 'echo t > "$CANOPY_TMP/m"; echo kept > kept.txt', 30)
    lease = await _lease(sandbox, tree)
    assert lease is not None and lease.handle is not None
    await _leave_lease(sandbox, tree, "releasing", lease.handle, TRANSITION_STALE_SECONDS + 60)

    handle = await manager.claim(tree, workdir)

    assert await _marker(manager, tree, workdir) == "fresh"  # the old sandbox was removed, then rebuilt
    assert (workdir / "kept.txt").read_text() == "kept\n"
    after = await _lease(sandbox, tree)
    assert after is not None and (after.state, after.handle) == ("active", handle)
    if sandbox.kind == "docker":
        assert handle != lease.handle and not await sandbox.backend.exists(lease.handle)


async def test_a_fresh_release_makes_a_claim_wait(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    handle = await manager.claim(tree, workdir)
    await _leave_lease(sandbox, tree, "releasing", handle, 0)

    claim = asyncio.create_task(manager.claim(tree, workdir))
    await asyncio.sleep(0.5)
    waited = not claim.done()
    async with sandbox.db.tx() as conn:  # the releaser settles
        assert await leases.settle(conn, tree, "releasing", handle, "released", None)
    await asyncio.wait_for(claim, 30)

    assert waited


async def test_the_sweep_finishes_a_stalled_release(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    handle = await manager.claim(tree, workdir)
    await _leave_lease(sandbox, tree, "releasing", handle, TRANSITION_STALE_SECONDS + 60)

    released = await manager.release_idle()

    assert tree not in released  # it was not idle; its release had stalled
    lease = await _lease(sandbox, tree)
    assert lease is not None and (lease.state, lease.handle) == ("released", None)
    assert not await sandbox.backend.exists(handle)


async def test_a_stalled_creation_is_taken_over(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    await manager.claim(tree, workdir)
    await _leave_lease(sandbox, tree, "creating", None, TRANSITION_STALE_SECONDS + 60)

    handle = await asyncio.wait_for(manager.claim(tree, workdir), 30)

    lease = await _lease(sandbox, tree)
    assert lease is not None and (lease.state, lease.handle) == ("active", handle)
    assert await sandbox.backend.exists(handle)


async def test_a_failed_claim_leaves_the_lease_as_it_was(sandbox: SandboxKit) -> None:
    manager = sandbox.manager()
    tree, _ = await sandbox.new_tree()
    not_a_dir = sandbox.root / f"file-{tree.hex[:8]}"
    not_a_dir.write_text("a file where the workdir should be")

    with pytest.raises(OSError):
        await manager.claim(tree, not_a_dir)
    first = await _lease(sandbox, tree)

    async with sandbox.db.tx() as conn:  # a tree that had a sandbox once
        await leases.lock(conn, tree, sandbox.backend.name)
    with pytest.raises(OSError):
        await manager.claim(tree, not_a_dir)
    second = await _lease(sandbox, tree)

    assert first is None  # a failed first claim leaves no row
    assert second is not None and (second.state, second.handle) == ("released", None)
    assert not_a_dir.read_text() == "a file where the workdir should be"


async def test_a_manager_never_claims_or_releases_another_nodes_sandbox(sandbox: SandboxKit) -> None:
    """A lease names the node of its sandbox and workdir: another node's manager refuses to use it
    (a sandbox built there would start from an empty workdir) and its idle sweep leaves it alone."""
    here, there = (SandboxManager(sandbox.db, sandbox.backend, 0, sandbox.options, node_id=node)
                   for node in ("node-a", "node-b"))
    tree, workdir = await sandbox.new_tree()
    await here.run_command(tree, workdir, 'echo kept > "$CANOPY_TMP/m"', 30)
    made = await _lease(sandbox, tree)
    assert made is not None and (made.state, made.node_id) == ("active", "node-a")
    sandboxes = await _sandboxes_of(sandbox, tree)

    with pytest.raises(SandboxMoved):
        await there.run_command(tree, workdir, "echo never", 30)
    released_there = await there.release_idle()

    assert await _lease(sandbox, tree) == made
    assert await _sandboxes_of(sandbox, tree) == sandboxes == [made.handle]
    assert tree not in released_there
    assert (await here.run_command(tree, workdir, 'cat "$CANOPY_TMP/m"', 30)).stdout == "kept\n"
    assert tree in await here.release_idle()


async def test_the_sandboxes_of_a_lost_node_are_released_still_naming_it(sandbox: SandboxKit) -> None:
    """A node that left the cluster took its sandboxes along, whatever their leases were doing: they
    are released and keep naming that node, so each tree's next command is the one told its workdir
    is lost. Other nodes' leases do not change, and an empty list of live nodes changes nothing."""
    alive, gone = (SandboxManager(sandbox.db, sandbox.backend, 300, sandbox.options, node_id=node)
                   for node in ("node-a", "node-b"))
    kept, kept_workdir = await sandbox.new_tree()
    await alive.run_command(kept, kept_workdir, "true", 30)
    lost: dict[str, uuid.UUID] = {}
    for state in ("active", "releasing", "creating"):
        lost[state], workdir = await sandbox.new_tree()
        await gone.run_command(lost[state], workdir, "true", 30)
    made = {state: await _lease(sandbox, tree) for state, tree in lost.items()}
    await _leave_lease(sandbox, lost["releasing"], "releasing", made["releasing"].handle, 0)
    await _leave_lease(sandbox, lost["creating"], "creating", None, 0)
    before = {tree: await _lease(sandbox, tree) for tree in [kept, *lost.values()]}

    async with sandbox.db.tx() as conn:
        nothing = await leases.release_on_lost_nodes(conn, set())
    unchanged = {tree: await _lease(sandbox, tree) for tree in before}
    async with sandbox.db.tx() as conn:
        released = await leases.release_on_lost_nodes(conn, {"node-a", "node-c"})

    assert nothing == [] and unchanged == before
    assert sorted(released) == sorted(lost.values())
    for tree in lost.values():
        lease = await _lease(sandbox, tree)
        assert lease is not None
        assert (lease.state, lease.handle, lease.node_id, lease.workdir_lost_at) == ("released", None, "node-b", None)
    assert await _lease(sandbox, kept) == before[kept]


async def test_nodes_recorded_are_the_live_ones_and_those_leases_name(sandbox: SandboxKit) -> None:
    """Ray gives every node a new id each time it starts: a row per node of every life of the cluster
    grew for ever. A node that is not live and that no lease names is forgotten."""
    named, live, gone = (f"node-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("named", "live", "gone"))
    tree, workdir = await sandbox.new_tree()
    await SandboxManager(sandbox.db, sandbox.backend, 300, sandbox.options, node_id=named).run_command(
        tree, workdir, "true", 30)
    async with sandbox.db.tx() as conn:
        await leases.record_nodes(conn, {named: "10.0.0.1", gone: "10.0.0.2", live: "10.0.0.3"})
    async with sandbox.db.tx() as conn:
        await leases.record_nodes(conn, {live: "10.0.0.3"})
        cur = await conn.execute("SELECT node_id, address FROM ray_nodes WHERE node_id = ANY(%s) ORDER BY address",
                                 ([named, live, gone],))
        recorded = await cur.fetchall()
    assert recorded == [{"node_id": named, "address": "10.0.0.1"}, {"node_id": live, "address": "10.0.0.3"}]


async def test_trees_with_a_running_run_do_not_fill_the_sweeps_page(sandbox: SandboxKit) -> None:
    """The sweep reads its candidates a page at a time, least recently used first: a tree whose Run
    runs (however long ago it touched its sandbox) is no candidate, or a page of them would hide
    the idle trees behind it for as long as they run."""
    manager = sandbox.manager()
    busy, idle = [await sandbox.new_tree() for _ in range(2)]
    for tree, workdir in (busy, idle):
        await manager.claim(tree, workdir)
    await insert_running_run(sandbox, busy[0])
    await last_used(sandbox, busy[0], 7200)
    await last_used(sandbox, idle[0], 3600)

    async with sandbox.db.tx() as conn:
        page = await leases.idle_trees(conn, 1800, limit=1)
    released = await manager.release_idle()

    assert page == [idle[0]]
    assert idle[0] in released and busy[0] not in released
    assert [(await _lease(sandbox, tree)).state for tree, _ in (busy, idle)] == ["active", "released"]


async def test_a_scopes_sandboxes_are_bounded_and_its_idle_ones_make_room(sandbox: SandboxKit) -> None:
    """A user's trees hold at most ``max_per_scope`` sandboxes. A claim past it releases the least
    recently used idle one of theirs (never a busy one, nor another user's); with none idle it is
    refused and leaves nothing behind. Other users are not held up."""
    counted = GatedBackend(sandbox.backend, gated="nothing")  # counts the backend's calls, holds none
    manager = SandboxManager(sandbox.db, counted, 300, dataclasses.replace(sandbox.options, max_per_scope=2))
    busy = await sandbox.new_tree()
    idle = await sandbox.new_tree(scope_of=busy[0])
    stranger = await sandbox.new_tree()  # another user's, idle longest of all
    for tree, workdir in (busy, idle, stranger):
        await manager.claim(tree, workdir)
    await insert_running_run(sandbox, busy[0])
    for (tree, _), hours in ((busy, 3), (idle, 1), (stranger, 5)):
        await last_used(sandbox, tree, hours * 3600)

    third = await sandbox.new_tree(scope_of=busy[0])
    counted_before = await made_room(sandbox, "scope")
    calls_before = counted.calls.copy()
    await manager.claim(*third)
    # One release to make room, then one build, announced by its lease: none before the room was made.
    assert counted.calls - calls_before == {"release": 1, "ensure": 1}
    fourth = await sandbox.new_tree(scope_of=busy[0])
    with pytest.raises(SandboxError, match="CANOPY_SANDBOX_MAX_PER_SCOPE"):
        await manager.claim(*fourth)  # busy's Run runs, and third was claimed a moment ago
    another_users = await sandbox.new_tree(scope_of=stranger[0])
    await manager.claim(*another_users)

    states = [(await _lease(sandbox, tree)) for tree, _ in (busy, idle, stranger, third, fourth, another_users)]
    assert [lease.state if lease else None for lease in states] == [
        "active", "released", "active", "active", None, "active"
    ]
    assert await _sandboxes_of(sandbox, idle[0]) == [] and await _sandboxes_of(sandbox, fourth[0]) == []
    assert len(await _sandboxes_of(sandbox, third[0])) == 1
    assert await made_room(sandbox, "scope") == counted_before + 1


async def test_a_scope_full_claim_names_the_nodes_whose_idle_sandboxes_may_go(sandbox: SandboxKit) -> None:
    """A user's limit counts every node, and a node releases only its own: a claim past it with
    none of theirs idle on its node is refused naming the nodes that hold idle ones, whose managers
    release one on request (actors/sandbox_hosts.py asks them), and the claim is made then."""
    options = dataclasses.replace(sandbox.options, max_per_scope=1)
    here, there = (SandboxManager(sandbox.db, sandbox.backend, 300, options, node_id=node)
                   for node in ("node-a", "node-b"))
    idle_there = await sandbox.new_tree()
    await there.claim(*idle_there)
    await last_used(sandbox, idle_there[0], 3600)
    claim = await sandbox.new_tree(scope_of=idle_there[0])

    with pytest.raises(ScopeFull, match="CANOPY_SANDBOX_MAX_PER_SCOPE") as full:
        await here.claim(*claim)
    assert full.value.nodes == ["node-b"]
    assert await _lease(sandbox, claim[0]) is None  # refused: nothing made, not even its lease
    assert not await here.make_room_in_scope(claim[0])  # nothing of theirs is idle on node-a
    assert await there.make_room_in_scope(claim[0])
    await here.claim(*claim)

    assert [(await _lease(sandbox, tree)).state for tree in (idle_there[0], claim[0])] == ["released", "active"]
    assert await _sandboxes_of(sandbox, idle_there[0]) == []


async def test_two_claims_of_a_scope_never_both_take_its_last_place(sandbox: SandboxKit) -> None:
    options = dataclasses.replace(sandbox.options, max_per_scope=2)
    first = await sandbox.new_tree()
    rivals = [await sandbox.new_tree(scope_of=first[0]) for _ in range(2)]
    await SandboxManager(sandbox.db, sandbox.backend, 300, options).claim(*first)

    outcomes = await asyncio.gather(
        *(SandboxManager(sandbox.db, sandbox.backend, 300, options).claim(*rival) for rival in rivals),
        return_exceptions=True,
    )

    won = [outcome for outcome in outcomes if isinstance(outcome, str)]
    lost = [outcome for outcome in outcomes if not isinstance(outcome, str)]
    assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], SandboxError), outcomes
    loser = rivals[outcomes.index(lost[0])][0]
    assert await _lease(sandbox, loser) is None and await _sandboxes_of(sandbox, loser) == []


async def test_the_sweep_finishes_a_stalled_creation_and_its_sandbox_is_then_an_orphan(sandbox: SandboxKit) -> None:
    """A process that died while it built a tree's sandbox left the lease ``creating``, which counts
    as one of the scope's sandboxes: only the same tree's next claim took it over, so a tree never
    claimed again held that place for good. The sweep releases it; the sandbox it built, never
    named by the lease, goes as an orphan."""
    manager = sandbox.manager()
    tree, workdir = await sandbox.new_tree()
    built = await manager.claim(tree, workdir)  # what the dead process built before its lease said so
    await _leave_lease(sandbox, tree, "creating", None, TRANSITION_STALE_SECONDS + 60)
    sibling, _ = await sandbox.new_tree(scope_of=tree)

    async def places_held() -> int:
        async with sandbox.db.tx() as conn:
            return await leases.scope_held(conn, sibling)

    assert await places_held() == 1
    released = await manager.release_idle()

    assert tree not in released  # not idle: its creation had stalled
    lease = await _lease(sandbox, tree)
    assert lease is not None and (lease.state, lease.handle) == ("released", None)
    assert await places_held() == 0
    assert built in await manager.reap_orphans()
    assert not await sandbox.backend.exists(built)
