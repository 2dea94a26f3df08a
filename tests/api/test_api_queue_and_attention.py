"""What the UI lists beside a conversation: a session's queued inputs (to cancel one) and, in the
list of roots, each tree's attention counts."""

from __future__ import annotations

import httpx

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from persistence import views
from persistence.records import Scope
from tests.api.helpers import poll, rows, seq_scans, terminal

NO_ATTENTION = {"running": 0, "queued": 0, "waiting_cooperation": 0, "waiting_approval": 0, "waiting_answer": 0,
                "cancelling": 0, "failed": 0}


async def test_pending_inputs_listed_in_queue_order_and_cancelled(http: httpx.AsyncClient, runtime: Runtime) -> None:
    created = (await http.post("/api/v1/sessions", json={"input": script(say("slow", delay_ms=4000))})).json()
    root_id = created["session"]["session_id"]
    texts = [script(say("second"), task="second " + "x" * 600), script(say("third"), task="third")]
    receipts = []
    for text in texts:
        submitted = await http.post(f"/api/v1/sessions/{root_id}/inputs", json={"text": text})
        assert submitted.status_code == 202 and submitted.json()["status"] == "queued", submitted.text
        receipts.append(submitted.json())

    pending = (await http.get(f"/api/v1/sessions/{root_id}/inputs", params={"status": "pending"})).json()
    assert [i["input_id"] for i in pending] == [r["input_id"] for r in receipts]  # FIFO
    assert [i["status"] for i in pending] == ["pending", "pending"]
    assert pending[0]["text"] == texts[0][:500] and pending[0]["truncated"]
    assert pending[1]["text"] == texts[1] and not pending[1]["truncated"]
    assert pending[0]["origin"]["kind"] == "human" and pending[0]["turn_id"] is None
    assert set(pending[0]) >= {"input_id", "session_id", "status", "text", "origin", "created_at"}

    # Cancel the first queued input from the list: it leaves the pending list, the other stays.
    cancelled = await http.post(f"/api/v1/inputs/{pending[0]['input_id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    left = (await http.get(f"/api/v1/sessions/{root_id}/inputs", params={"status": "pending"})).json()
    assert [i["input_id"] for i in left] == [receipts[1]["input_id"]]
    stored = await rows(runtime.db, "SELECT input_id::text AS id, status FROM inputs WHERE session_id = %s "
                        "ORDER BY seq", root_id)
    assert [(r["id"], r["status"]) for r in stored] == [
        (created["input"]["input_id"], "consumed"), (receipts[0]["input_id"], "cancelled"),
        (receipts[1]["input_id"], "pending")]

    await poll(lambda: terminal(http, receipts[1]["input_id"]))
    everything = (await http.get(f"/api/v1/sessions/{root_id}/inputs")).json()
    assert [(i["input_id"], i["status"]) for i in everything] == [(r["id"], s) for r, s in zip(
        stored, ("consumed", "cancelled", "consumed"), strict=True)]
    assert everything[0]["turn_id"] == created["input"]["turn_id"] and everything[1]["turn_id"] is None
    limited = (await http.get(f"/api/v1/sessions/{root_id}/inputs", params={"limit": 1})).json()
    assert [i["input_id"] for i in limited] == [created["input"]["input_id"]]


async def test_every_input_is_reached_a_page_at_a_time_along_an_index(http: httpx.AsyncClient,
                                                                      runtime: Runtime) -> None:
    """The list had a limit and no way past it (a schedule every second gives 86,400 inputs a day),
    and read every input of the database for each page."""
    created = (await http.post("/api/v1/sessions", json={"input": script(say("slow", delay_ms=3000))})).json()
    root_id = created["session"]["session_id"]
    given = [created["input"]["input_id"]]
    for n in range(4):
        given.append((await http.post(f"/api/v1/sessions/{root_id}/inputs",
                                      json={"text": script(say(f"n{n}"))})).json()["input_id"])
    seen, url = [], f"/api/v1/sessions/{root_id}/inputs?limit=2"
    while url:
        page = await http.get(url)
        assert page.status_code == 200, page.text
        seen += [i["input_id"] for i in page.json()]
        link = page.links.get("next", {}).get("url")
        url = str(page.url.join(link)) if link else ""
    assert seen == given

    async with runtime.db.tx() as conn:  # read along the session's index, whatever the table holds
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute("EXPLAIN (FORMAT JSON) " + views._INPUTS, {  # type: ignore[operator]
            "session_id": root_id, "user_id": "u", "app_id": "a", "status": None, "after": 0, "limit": 2})
        plan = (await cur.fetchone())["QUERY PLAN"][0]["Plan"]  # type: ignore[index]
    assert "inputs" not in seq_scans(plan), plan


async def test_input_list_refuses_bad_filters(http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    root = (await http.post("/api/v1/sessions", json={"title": "filters"})).json()["session"]
    before = await rows(runtime.db, "SELECT count(*) AS n FROM inputs WHERE user_id = %s", scope.user_id)
    for params in ({"status": "queued"}, {"limit": 0}, {"limit": 1001}, {"limit": "x"}):
        refused = await http.get(f"/api/v1/sessions/{root['session_id']}/inputs", params=params)
        assert refused.status_code == 422, (params, refused.text)
    missing = await http.get("/api/v1/sessions/00000000-0000-0000-0000-000000000000/inputs")
    assert missing.status_code == 404
    assert await rows(runtime.db, "SELECT count(*) AS n FROM inputs WHERE user_id = %s", scope.user_id) == before


async def test_root_list_carries_tree_attention(http: httpx.AsyncClient) -> None:
    asker = script(call(("ask_user", {"question": "which?"})), say("answered"), task="ask")
    text = script(
        call(create("asker", asker), create("slow", script(say("late", delay_ms=60_000))),
             create("broken", script({"fail": "provider down"}))),
        call(("wait_inputs", {"input_ids": ["${0.input_id}", "${1.input_id}", "${2.input_id}"]})),
        say("never"))
    busy = (await http.post("/api/v1/sessions", json={"input": text, "title": "busy"})).json()["session"]
    quiet = (await http.post("/api/v1/sessions", json={"title": "quiet"})).json()["session"]
    expected = {**NO_ATTENTION, "members": 4, "running": 1, "waiting_cooperation": 1, "waiting_answer": 1,
                "failed": 1}

    async def settled() -> list | None:
        listed = (await http.get("/api/v1/sessions")).json()
        return listed if listed[1]["attention"] == expected else None

    try:
        listed = await poll(settled)
        assert [s["session_id"] for s in listed] == [quiet["session_id"], busy["session_id"]]
        assert listed[0]["attention"] == {**NO_ATTENTION, "members": 1}
        # The counts agree with the tree summary's members.
        summary = (await http.get(f"/api/v1/trees/{busy['tree_id']}")).json()
        activities = sorted(m["activity"] for m in summary["members"])
        assert activities == ["idle", "running", "waiting_answer", "waiting_cooperation"]
        assert [m["turn_status"] for m in summary["members"]].count("failed") == 1
    finally:
        stopped = await http.post(f"/api/v1/trees/{busy['tree_id']}/stop")
        assert stopped.status_code == 202, stopped.text
