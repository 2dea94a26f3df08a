"""The timeline and the trace of a tree, read back against the durable facts: a real 6-child fan-out
on the scripted model (its Run slices equal the runs table), synthetic 10- and 200-member trees
written through the repositories (a constant number of statements, stable pages), scoping, and
``canopy tree <id> --trace``."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any, get_args

import httpx

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from api.schemas import TimelineInterval
from api.trace import micros
from persistence import runs, timeline, turns
from persistence.db import Database
from persistence.records import Scope
from tests.api.conftest import ClientFactory
from tests.api.helpers import poll, rows, terminal
from tests.api.test_api_cli import canopy
from tests.persistence.helpers import ExplainingConnection, age_members, rows_read, seed_worked_tree

CHILD_DELAY_MS = 1500

# What the Trace Event Format (the "Trace Event Format" document of the Chrome tracing project,
# which chrome://tracing and Perfetto read) requires of each phase this API emits: every event
# names itself and its phase and sits at a time on a process and thread; a complete event adds
# its duration; an instant may scope itself (g: global, p: process, t: thread); a metadata event
# is one of the named kinds and carries its value in args.
REQUIRED = {
    "X": {"name": str, "ph": str, "ts": (int, float), "dur": (int, float), "pid": int, "tid": int},
    "i": {"name": str, "ph": str, "ts": (int, float), "pid": int, "tid": int},
    "M": {"name": str, "ph": str, "ts": (int, float), "pid": int, "tid": int, "args": dict},
}
OPTIONAL = {"cat": str, "args": dict, "s": str}
METADATA = {"process_name": "name", "process_sort_index": "sort_index", "thread_name": "name",
            "thread_sort_index": "sort_index", "process_labels": "labels"}


def check_trace_format(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event against REQUIRED / OPTIONAL / METADATA; the lanes of every slice are named."""
    assert set(trace) <= {"traceEvents", "displayTimeUnit", "otherData"} and trace["displayTimeUnit"] in ("ms", "ns")
    assert set(trace.get("otherData", {"next_cursor": ""})) == {"next_cursor"}
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    named_processes, named_threads = set(), set()
    for event in events:
        required = REQUIRED[event["ph"]]
        for field, kind in required.items():
            assert isinstance(event.get(field), kind) and not isinstance(event.get(field), bool), (field, event)
        for field, value in event.items():
            if field not in required:
                assert field in OPTIONAL and isinstance(value, OPTIONAL[field]), (field, event)
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
        if event["ph"] == "i":
            assert event.get("s", "t") in ("g", "p", "t"), event
        if event["ph"] == "M":
            assert event["name"] in METADATA and METADATA[event["name"]] in event["args"], event
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
    for event in events:
        if event["ph"] == "X":
            assert event["pid"] in named_processes and (event["pid"], event["tid"]) in named_threads, event
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere
    return events


def fan_out(children: int = 6, *, ask_first: str | None = None) -> str:
    """A root that creates ``children`` workers and waits for them all. ``ask_first``: it asks the
    human that first, and starts only once answered (a test that must watch the whole run)."""
    names = [f"w{i}" for i in range(children)]
    first = 1 if ask_first else 0  # the index of the first create among the Turn's tool calls
    return script(
        *([call(("ask_user", {"question": ask_first}))] if ask_first else []),
        call(*(create(n, script(say(f"{n} done", delay_ms=CHILD_DELAY_MS), task=f"work {n}")) for n in names)),
        call(("wait_inputs", {"input_ids": [f"${{{first + i}.input_id}}" for i in range(children)]})),
        say("all done"),
        task="Fan out to six workers",
    )


def peak(intervals: list[dict[str, Any]]) -> int:
    """The most intervals open at one instant (an end at an instant frees before a start there)."""
    points = sorted([(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals])
    most = current = 0
    for _, delta in points:
        current += delta
        most = max(most, current)
    return most


async def read_all(http: httpx.AsyncClient, tree_id: str, limit: int = 2000, **params: Any) -> dict[str, Any]:
    """Every page of a read, joined (the first page's as_of)."""
    first = page = (await http.get(f"/api/v1/trees/{tree_id}/timeline", params={"limit": limit, **params})).json()
    intervals, instants = list(page["intervals"]), list(page["instants"])
    while page["next_cursor"]:
        response = await http.get(f"/api/v1/trees/{tree_id}/timeline", params={"limit": limit,
                                                                                "since": page["next_cursor"]})
        assert response.status_code == 200, response.text
        page = response.json()
        assert page["as_of"] == first["as_of"]
        intervals += page["intervals"]
        instants += page["instants"]
    return {**first, "intervals": intervals, "instants": instants}


def when(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


async def _every_call_recorded(runtime: Runtime, tree_id: str) -> bool:
    counted = await rows(runtime.db, """
        SELECT (SELECT count(*) FROM model_calls c JOIN runs r USING (run_id) WHERE r.tree_id = %s) AS calls,
               (SELECT count(*) FROM thread_messages m JOIN sessions s USING (session_id)
                WHERE s.tree_id = %s AND m.role = 'assistant') AS replies""", uuid.UUID(tree_id), uuid.UUID(tree_id))
    return counted[0]["calls"] >= counted[0]["replies"]


async def test_fan_out_timeline_and_trace_match_the_runs_table(http: httpx.AsyncClient, runtime: Runtime,
                                                               scope: Scope, tmp_path: Path) -> None:
    created = (await http.post("/api/v1/sessions", json={"input": fan_out()})).json()
    tree_id = created["session"]["tree_id"]

    # Live: while the tree runs, a read shows open intervals, and a read since it shows them again.
    live = await poll(lambda: _open_read(http, tree_id))
    again = await read_all(http, tree_id, since=live["as_of"])
    still_known = {(i["kind"], i["id"]) for i in again["intervals"]}
    assert {(i["kind"], i["id"]) for i in live["intervals"] if i["end"] is None} <= still_known

    await poll(lambda: terminal(http, created["input"]["input_id"]))
    # A gateway records its finished calls in the background (actors/gateway_actor.py): the last
    # reply can be committed before its model call's row. Every reply here had one call.
    await poll(lambda: _every_call_recorded(runtime, tree_id))
    found = await read_all(http, tree_id, limit=7)  # small pages: the cursor is exercised
    members = {m["path"]: m["session_id"] for m in found["members"]}
    assert list(members) == ["/root"] + [f"/root/w{i}" for i in range(6)]

    # Runs: exactly the runs table's started Runs, with its times; at most 4 at once, and 4 at the peak.
    runs = [i for i in found["intervals"] if i["kind"] == "run"]
    table = await rows(runtime.db, "SELECT run_id, session_id, started_at, ended_at, status FROM runs "
                                   "WHERE tree_id = %s AND started_at IS NOT NULL", uuid.UUID(tree_id))
    assert {(r["id"], when(r["start"]), when(r["end"])) for r in runs} == \
        {(str(r["run_id"]), r["started_at"], r["ended_at"]) for r in table}
    assert peak([{"start": when(r["start"]), "end": when(r["end"])} for r in runs]) == 4

    # Two children queued until a sibling finished: 3 slots were free at their creation, the root's
    # park freed a fourth, and the last two waited for the first child to end (its slot, then the next).
    child_runs = [r for r in runs if r["path"] != "/root"]
    first_end = min(when(r["end"]) for r in child_runs)
    queued = [i for i in found["intervals"] if i["kind"] == "queued" and i["path"] != "/root"]
    waited = [i for i in queued if when(i["end"]) >= first_end]
    assert len(queued) == 6 and len(waited) == 2, queued
    assert all(when(i["end"]) - when(i["start"]) >= dt.timedelta(milliseconds=CHILD_DELAY_MS) for i in waited)

    # The root's wait watches the six children and spans their work; the root resumes after it.
    (wait,) = [i for i in found["intervals"] if i["kind"] == "wait"]
    assert wait["path"] == "/root" and wait["status"] == "resumed" and wait["name"] == "inputs"
    assert sorted(wait["waits_on"]) == sorted(members[f"/root/w{i}"] for i in range(6))
    assert when(wait["start"]) < min(when(r["end"]) for r in child_runs)
    assert when(wait["end"]) >= max(when(r["end"]) for r in child_runs)
    resume = [r for r in runs if r["path"] == "/root" and r["name"] == "resume"]
    assert len(resume) == 1 and when(resume[0]["start"]) >= when(wait["end"])

    # Model calls and tool calls sit inside their Runs; the create and wait calls are there.
    calls = await rows(runtime.db, "SELECT m.id FROM model_calls m JOIN runs r USING (run_id) WHERE r.tree_id = %s",
                       uuid.UUID(tree_id))
    model = [i for i in found["intervals"] if i["kind"] == "model_call"]
    assert sorted(i["id"] for i in model) == sorted(str(c["id"]) for c in calls)
    run_span = {r["id"]: (when(r["start"]), when(r["end"])) for r in runs}
    for item in model:
        start, end = run_span[item["run_id"]]
        assert start <= when(item["start"]) and when(item["end"]) <= end, item
    tools = [i for i in found["intervals"] if i["kind"] == "tool_call" and i["path"] == "/root"]
    assert [t["name"] for t in tools].count("create_session") == 6 and [t["name"] for t in tools][-1] == "wait_inputs"

    # The trace: valid trace-event JSON whose Run slices are the runs table, to the microsecond.
    trace = (await http.get(f"/api/v1/trees/{tree_id}/trace")).json()
    events = check_trace_format(trace)
    slices = [e for e in events if e["ph"] == "X" and e["cat"] == "run"]
    assert sorted((e["args"]["id"], e["ts"], e["dur"]) for e in slices) == sorted(
        (str(r["run_id"]), micros(r["started_at"]), micros(r["ended_at"]) - micros(r["started_at"])) for r in table)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(members)
    assert "otherData" not in trace  # one page: the whole tree

    # In pages of at most `limit` items, each a trace of its own, following otherData.next_cursor: the same.
    paged: list[str] = []
    since: dict[str, str] = {}
    while True:
        part = (await http.get(f"/api/v1/trees/{tree_id}/trace", params={"limit": 7, **since})).json()
        items = [json.dumps(e, sort_keys=True) for e in check_trace_format(part) if e["ph"] != "M"]
        assert 0 < len(items) <= 7
        paged += items
        if "otherData" not in part:
            break
        since = {"since": part["otherData"]["next_cursor"]}
    assert sorted(paged) == sorted(json.dumps(e, sort_keys=True) for e in events if e["ph"] != "M")
    assert len(paged) > 2 * 7
    assert {names[e["pid"]] for e in slices} == set(members)

    # The operator command writes the same trace.
    out = tmp_path / "trace.json"
    code, printed = await canopy(runtime, "tree", tree_id, "--trace", str(out), "--user", scope.user_id,
                                 "--app", scope.app_id)
    assert code == 0 and "trace events" in printed, printed
    assert json.loads(out.read_text()) == trace


async def test_a_commands_interval_lasts_until_its_outcome(http: httpx.AsyncClient, runtime: Runtime) -> None:
    """A command's receipt is committed as it starts (so that it never runs twice unasked): its
    interval ended there, "ok", while the command still ran, and a read since a moment after it never
    showed its outcome. It ends with the command's result, and is open until then."""
    text = script(call(("run_command", {"command": "sleep 2; echo slept"})), say("ran"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    tree_id = created["session"]["tree_id"]

    async def started() -> dict[str, Any] | None:  # the receipt is committed: the command runs
        found = await rows(runtime.db, "SELECT r.state FROM tool_receipts r JOIN turns t USING (turn_id) "
                           "WHERE t.session_id = %s", uuid.UUID(tree_id))
        return await read_all(http, tree_id) if found and found[0]["state"] == "started" else None

    running = [i for i in (await poll(started))["intervals"] if i["kind"] == "tool_call"]
    await poll(lambda: terminal(http, created["input"]["input_id"]))
    done = [i for i in (await read_all(http, tree_id))["intervals"] if i["kind"] == "tool_call"]

    assert [(i["status"], i["end"]) for i in running] == [("open", None)], running
    [result] = await rows(runtime.db, "SELECT created_at FROM thread_messages WHERE session_id = %s AND role = 'tool'",
                          uuid.UUID(tree_id))
    assert [(i["status"], when(i["end"])) for i in done] == [("ok", result["created_at"])], done


async def _open_read(http: httpx.AsyncClient, tree_id: str) -> dict[str, Any] | None:
    found = await read_all(http, tree_id)
    return found if any(i["end"] is None for i in found["intervals"]) else None


class CountingConnection:
    """The real connection, counting the statements sent through it (nothing is faked)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements = 0

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return await self.conn.execute(*args, **kwargs)


async def _counted_read(db: Database, scope: Scope, tree_id: uuid.UUID, limit: int | None) -> tuple[list, list]:
    """Every page of the tree's timeline read through a counting connection: (items, statements per page)."""
    items: list[tuple[str, str]] = []
    per_page: list[int] = []
    page = None
    while True:
        async with db.tx() as conn:
            counting = CountingConnection(conn)
            found = await timeline.timeline(counting, scope, tree_id, page=page, limit=limit)  # type: ignore[arg-type]
        per_page.append(counting.statements)
        items += [(i["kind"], i["id"]) for i in found["intervals"]]
        page = found["next"]
        if page is None:
            return items, per_page


async def test_statements_do_not_grow_with_the_tree(runtime: Runtime, scope: Scope, client_for: ClientFactory
                                                    ) -> None:
    # Each member runs 3 Turns; the third parks and resumes: 4 Runs, 4 queued, 1 wait, 3 tool calls.
    small = await seed_worked_tree(runtime.db, scope, members=10, turns_per_member=3, wait_every=3)
    large = await seed_worked_tree(runtime.db, scope, members=200, turns_per_member=3, wait_every=3)
    counts = {}
    for tree in (small, large):
        whole, (statements,) = await _counted_read(runtime.db, scope, tree.tree_id, limit=None)
        paged, per_page = await _counted_read(runtime.db, scope, tree.tree_id, limit=250)
        assert paged == whole  # pages neither repeat nor skip
        assert len(per_page) == -(-len(whole) // 250) and set(per_page) == {statements}
        counts[tree.tree_id] = (statements, len(whole))
    assert counts[small.tree_id] == (3, 10 * 12) and counts[large.tree_id] == (3, 200 * 12), counts
    runs_table = await rows(runtime.db, "SELECT count(*) AS n FROM runs WHERE tree_id = %s", large.tree_id)
    http = await client_for(scope)
    found = await read_all(http, str(large.tree_id), limit=1000)
    kinds = [i["kind"] for i in found["intervals"]]
    assert kinds.count("run") == kinds.count("queued") == runs_table[0]["n"] == 200 * 4
    assert kinds.count("wait") == 200 and kinds.count("tool_call") == 200 * 3
    # A read since a moment after everything ended finds nothing: nothing is open, nothing ended later.
    later = (dt.datetime.now(dt.UTC) + timeline.COMMIT_LAG * 2).isoformat()
    assert (await read_all(http, str(large.tree_id), since=later))["intervals"] == []


async def test_reads_of_an_aged_tree_skip_nothing_they_owe(runtime: Runtime, scope: Scope, client_for: ClientFactory
                                                           ) -> None:
    # A "since" read and the pages of a read leave out the Turns that ended before what they ask for
    # (persistence/timeline.py): against a history spread over 90 minutes, they return exactly what
    # the whole read filtered by hand does, and the pages neither repeat nor skip an item.
    tree = await seed_worked_tree(runtime.db, scope, members=30, turns_per_member=3, wait_every=3)
    await age_members(runtime.db, tree.tree_id, minutes_each=3)
    # A Run ends after its Turn: the finishing transaction stamps the Turn's end with its start and the
    # Run's with the real moment (here 50 s later, as an aborted model call's record can be).
    [late] = await rows(runtime.db, """
        UPDATE runs SET ended_at = ended_at + interval '50 seconds'
        WHERE run_id = (SELECT r.run_id FROM runs r JOIN sessions s USING (session_id)
                        WHERE s.tree_id = %s AND s.path <> '/root' ORDER BY r.ended_at DESC LIMIT 1)
        RETURNING ended_at""", tree.tree_id)
    async with runtime.db.tx() as conn:  # one Turn runs, held by nobody the runtime knows: open for the test
        receipt = await turns.submit_input(conn, scope, tree.root_id, "one more", {"kind": "human"})
        granted = await runs.grant_slots(conn, tree.tree_id, 3600)
        held = await runs.acquire_run(conn, granted[0]["run_id"], "test-owner", 3600)
    assert held is not None and granted[0]["turn_id"] == receipt["turn_id"]
    http = await client_for(scope)
    whole = await read_all(http, str(tree.tree_id))
    assert len(whole["intervals"]) == 30 * 12 + 2  # its Run and its time queued
    key = [(i["start"], i["kind"], i["id"]) for i in whole["intervals"]]
    assert [(i["start"], i["kind"], i["id"]) for i in (await read_all(http, str(tree.tree_id), limit=7))["intervals"]
            ] == key
    now = dt.datetime.now(dt.UTC)
    for since in [now - dt.timedelta(minutes=minutes) for minutes in (2, 31, 46, 88)] + [
            late["ended_at"] + timeline.COMMIT_LAG - dt.timedelta(seconds=5)]:
        owed = [i["id"] for i in whole["intervals"]
                if i["end"] is None or when(i["end"]) >= since - timeline.COMMIT_LAG]
        found = await read_all(http, str(tree.tree_id), limit=5, since=since.isoformat())
        assert [i["id"] for i in found["intervals"]] == owed, since
        assert 0 < len(owed) < len(whole["intervals"])
    async with runtime.db.tx() as conn:
        await turns.finish_turn(conn, held, "completed", output="done")


async def test_a_read_since_reads_the_open_and_recent_turns_not_the_history(runtime: Runtime, scope: Scope) -> None:
    # The web UI repeats a "since" read while a tree runs: it costs what is open or recent, however
    # many Turns each member ran before (the server's own account of the rows it read).
    tree = await seed_worked_tree(runtime.db, scope, members=20, turns_per_member=30, wait_every=0)
    await age_members(runtime.db, tree.tree_id, minutes_each=3)
    async with runtime.db.tx() as conn:  # one Turn open; planner statistics as a running database has them
        await turns.submit_input(conn, scope, tree.root_id, "one more", {"kind": "human"})
        await conn.execute("ANALYZE turns, sessions")
    async with runtime.db.tx() as conn:
        explaining = ExplainingConnection(conn)
        found = await timeline.timeline(explaining, scope, tree.tree_id,  # type: ignore[arg-type]
                                        since=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
        history = await (await conn.execute("SELECT count(*) AS n FROM turns JOIN sessions USING (session_id) "
                                            "WHERE tree_id = %s", (tree.tree_id,))).fetchone()
    assert [i["kind"] for i in found["intervals"]] == ["queued"]  # the open Turn's Run, not yet granted
    assert history["n"] == 20 * 30 + 1
    items_plan = explaining.plans[-1]
    assert rows_read(items_plan, "turns") <= 1, items_plan


async def test_another_scope_gets_404_and_bad_cursors_422(runtime: Runtime, scope: Scope,
                                                          client_for: ClientFactory) -> None:
    tree = await seed_worked_tree(runtime.db, scope, members=3, turns_per_member=1)
    owner = await client_for(scope)
    stranger = await client_for(Scope(f"other-{uuid.uuid4().hex[:8]}", scope.app_id))
    for path in ("timeline", "trace"):
        assert (await owner.get(f"/api/v1/trees/{tree.tree_id}/{path}")).status_code == 200
        response = await stranger.get(f"/api/v1/trees/{tree.tree_id}/{path}")
        assert response.status_code == 404 and "no tree" in response.json()["detail"]
        assert (await owner.get(f"/api/v1/trees/{uuid.uuid4()}/{path}")).status_code == 404
    earliest = await owner.get(f"/api/v1/trees/{tree.tree_id}/timeline", params={"since": "0001-01-01T00:00:00"})
    assert earliest.status_code == 200 and earliest.json()["intervals"]  # nothing precedes it: everything
    for bad in ("not-a-cursor", "e30", "W10"):
        response = await owner.get(f"/api/v1/trees/{tree.tree_id}/timeline", params={"since": bad})
        assert response.status_code == 422 and "cursor" in response.json()["detail"], response.text


def test_the_kinds_a_cursor_may_name_are_the_kinds_the_api_returns() -> None:
    """A cursor names the kind of the last item read, and one naming another kind is refused: a kind
    the timeline returns and the cursor check does not know would end its paging with a 422."""
    assert set(get_args(TimelineInterval.model_fields["kind"].annotation)) == timeline.INTERVAL_KINDS


async def test_a_cursor_naming_no_kind_or_an_unstorable_id_is_refused(runtime: Runtime, scope: Scope,
                                                                     client_for: ClientFactory) -> None:
    tree = await seed_worked_tree(runtime.db, scope, members=3, turns_per_member=1)
    http = await client_for(scope)
    now = dt.datetime.now(dt.UTC)
    path = f"/api/v1/trees/{tree.tree_id}/timeline"

    def cursor(kind: str, item_id: str) -> str:  # encoded as the API encodes its own next_cursor
        return timeline.Page(now, None, (now - dt.timedelta(days=1), kind, item_id)).encode()

    assert (await http.get(path, params={"since": cursor("run", str(uuid.uuid4()))})).status_code == 200
    for kind, item_id in (("\ud800", "x"), ("run", "\udfff"), ("run", "a\x00b"), ("no_such_kind", "x")):
        response = await http.get(path, params={"since": cursor(kind, item_id)})
        assert response.status_code == 422 and "cursor" in response.json()["detail"], (kind, item_id, response.text)
