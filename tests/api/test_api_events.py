"""Server-Sent Events: replay after a cursor, resume with Last-Event-ID exactly once, ``?after=latest``
and the tree summary's cursor, heartbeats, live deltas, and a disconnect that frees the stream's resources."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections.abc import AsyncIterator

import httpx

from actors.runtime import Runtime
from actors.scripted import call, create, say, script
from api.app import create_app
from api.hub import EventHub
from api.sse import StreamSettings, event_stream
from persistence import scopes
from persistence.events import append_event
from persistence.records import Scope
from persistence.scopes import hash_key
from tests.api.conftest import ApiServer, ClientFactory, uvicorn_server
from tests.api.helpers import ADMIN_TOKEN, client, collect_events, poll, rows, sse_frames, terminal
from tests.persistence.helpers import tcp_link

EVENT_FIELDS = {"cursor", "kind", "session_id", "tree_id", "turn_id", "run_id", "payload", "created_at"}


async def _subscribers_gone(api: ApiServer) -> bool:
    return api.app.state.hub.subscriber_count == 0


async def test_reconnect_with_last_event_id_gets_every_later_event_once(
        api: ApiServer, http: httpx.AsyncClient, runtime: Runtime) -> None:
    children = [create(f"w{i}", script(say(f"w{i} done", delay_ms=400 * (i + 1)))) for i in range(3)]
    text = script(call(*children), call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(3)]})),
                  say("all done"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    root_id = created["session"]["session_id"]
    path = f"/api/v1/trees/{root_id}/events"

    # First connection: read a handful of events, then drop the connection mid-run.
    first = await collect_events(http, path, until=lambda e: e["kind"] == "waiting_cooperation")
    assert all(set(event) == EVENT_FIELDS for event in first)
    await poll(lambda: _subscribers_gone(api), timeout=10)
    await asyncio.sleep(1.0)  # the tree keeps producing events while nobody listens

    def root_done(event: dict) -> bool:
        return event["kind"] == "turn_completed" and event["session_id"] == root_id

    second = await collect_events(http, path, headers={"Last-Event-ID": str(first[-1]["cursor"])}, until=root_done)
    seen = [event["cursor"] for event in first + second]
    stored = await rows(runtime.db, "SELECT cursor FROM events WHERE tree_id = %s AND cursor <= %s ORDER BY cursor",
                        uuid.UUID(root_id), second[-1]["cursor"])
    assert seen == [row["cursor"] for row in stored]  # every event, in order, none twice
    assert len(set(seen)) == len(seen)
    await poll(lambda: _subscribers_gone(api), timeout=10)

    # ?after= replays too, and Last-Event-ID wins over it (a reconnecting EventSource keeps its URL).
    middle = first[len(first) // 2]["cursor"]
    replay = await collect_events(http, path, params={"after": 0}, headers={"Last-Event-ID": str(middle)},
                                  until=root_done)
    assert [e["cursor"] for e in replay] == [c for c in seen if c > middle]
    after = await collect_events(http, path, params={"after": middle}, until=root_done)
    assert after == replay


async def test_session_stream_heartbeats_and_live_deltas(api: ApiServer, http: httpx.AsyncClient) -> None:
    root = (await http.post("/api/v1/sessions", json={"title": "idle"})).json()["session"]
    frames: list[dict] = []

    async def watch() -> None:
        async with http.stream("GET", f"/api/v1/sessions/{root['session_id']}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for frame in sse_frames(response):
                frames.append(frame)
                if "id" in frame and json.loads(frame["data"])["kind"] == "turn_completed":
                    return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(2.5)  # idle: only the session_created event and keep-alive comments
    assert any(frame.get("comment") == "keep-alive" for frame in frames)
    submitted = await http.post(f"/api/v1/sessions/{root['session_id']}/inputs",
                                json={"text": script(say("alpha beta gamma", delay_ms=300))})
    assert submitted.status_code == 202, submitted.text
    await asyncio.wait_for(watcher, 60)
    deltas = [json.loads(frame["data"]) for frame in frames if frame.get("event") == "delta"]
    assert "".join(d["delta"] for d in deltas) == "alpha beta gamma"
    assert all("id" not in frame for frame in frames if frame.get("event") == "delta")  # deltas have no cursor
    kinds = [json.loads(frame["data"])["kind"] for frame in frames if "id" in frame]
    assert kinds[0] == "session_created" and kinds[-1] == "turn_completed"
    # The text comes before the event of the message it became (a client can swap one for the other).
    reply = next(i for i, frame in enumerate(frames) if "id" in frame
                 and json.loads(frame["data"])["payload"].get("role") == "assistant")
    assert max(i for i, frame in enumerate(frames) if frame.get("event") == "delta") < reply
    await poll(lambda: _subscribers_gone(api), timeout=10)


async def test_only_streams_with_deltas_mark_their_tree_watched(
        http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    root = (await http.post("/api/v1/sessions", json={"title": "watched?"})).json()["session"]
    tree_id = uuid.UUID(root["tree_id"])
    marks = "SELECT watched_until - now() AS left FROM stream_watchers WHERE tree_id = %s"
    async with http.stream("GET", f"/api/v1/trees/{tree_id}/events", params={"deltas": "false"}) as response:
        assert response.status_code == 200
        assert await rows(runtime.db, marks, tree_id) == []
    async with http.stream("GET", f"/api/v1/sessions/{root['session_id']}/events") as response:
        assert response.status_code == 200
        [mark] = await rows(runtime.db, marks, tree_id)
    assert 50 < mark["left"].total_seconds() <= 60  # StreamSettings.watch_seconds

    # While a stream stays open it renews the mark before it runs out.
    await runtime.watch_tree(scope, tree_id, seconds=0.5)
    hub = EventHub("postgresql:///nowhere?host=/nonexistent")
    stream = event_stream(hub, runtime.db, scope, after=0, tree_id=tree_id, watched_tree_id=tree_id,
                          settings=StreamSettings(heartbeat_seconds=0.2, fallback_poll_seconds=0.1,
                                                  watch_seconds=0.5, watch_refresh_seconds=0.2))

    async def read_for(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_drain(stream), seconds)

    await read_for(1.5)
    [mark] = await rows(runtime.db, marks, tree_id)
    await stream.aclose()
    assert mark["left"].total_seconds() > 0


async def _drain(stream: AsyncIterator[bytes]) -> None:
    async for _chunk in stream:
        pass


async def test_streams_are_scoped_and_validated(http: httpx.AsyncClient, client_for: ClientFactory) -> None:
    root = (await http.post("/api/v1/sessions", json={"title": "mine"})).json()["session"]
    other = await client_for(Scope(f"user-{uuid.uuid4().hex[:8]}", "other-app"))
    assert (await other.get(f"/api/v1/sessions/{root['session_id']}/events")).status_code == 404
    assert (await other.get(f"/api/v1/trees/{root['tree_id']}/events")).status_code == 404
    bad = await http.get(f"/api/v1/trees/{root['tree_id']}/events", headers={"Last-Event-ID": "abc"})
    assert bad.status_code == 422


async def test_streams_poll_while_the_listener_is_down(runtime: Runtime, scope: Scope) -> None:
    hub = EventHub("postgresql:///nowhere?host=/nonexistent")  # never started: no notification ever arrives
    created = await runtime.create_root(scope, title="polled")
    session_id = created["session"]["session_id"]
    stream = event_stream(hub, runtime.db, scope, after=0, session_id=session_id,
                          settings=StreamSettings(heartbeat_seconds=30, fallback_poll_seconds=0.1))
    kinds: list[str] = []

    async def read() -> None:
        async for chunk in stream:
            text = chunk.decode()
            if text.startswith("id: "):
                kinds.append(json.loads(text.split("data: ", 1)[1])["kind"])
                if kinds[-1] == "session_created":
                    await runtime.submit_input(scope, session_id, script(say("polled")))
                if kinds[-1] == "turn_completed":
                    return

    await asyncio.wait_for(read(), 60)
    await stream.aclose()
    assert kinds[0] == "session_created" and "turn_started" in kinds and kinds[-1] == "turn_completed"
    assert hub.subscriber_count == 0


async def test_a_stream_ends_after_its_byte_budget_and_resumes_from_its_last_event(
        runtime: Runtime, scope: Scope) -> None:
    """Serve passes a stream on without waiting for its reader: a client that stopped reading had
    the tree's whole history, and all that followed, held in the proxy's memory. A stream now ends
    after a budget of bytes, and the client's Last-Event-ID takes it on from there, losing nothing."""
    created = await runtime.create_root(scope, title="long")
    session_id = created["session"]["session_id"]
    for i in range(6):
        receipt = await runtime.submit_input(scope, session_id, script(say(f"reply {i}")))
        await runtime.wait_result(scope, receipt["input_id"], timeout=60)
    expected = await _scope_events(runtime, scope)
    hub = EventHub("postgresql:///nowhere?host=/nonexistent")
    settings = StreamSettings(heartbeat_seconds=30, fallback_poll_seconds=0.1, max_bytes=1500)

    async def one_stream(after: int) -> list[int]:
        seen = []
        stream = event_stream(hub, runtime.db, scope, after=after, session_id=session_id, settings=settings)
        async for chunk in stream:  # ends by itself, at the budget
            if chunk.startswith(b"id: "):
                seen.append(int(chunk.split(b"\n", 1)[0].removeprefix(b"id: ")))
            if seen and seen[-1] == expected[-1]:
                await stream.aclose()
                break
        return seen

    streams: list[list[int]] = []
    while not streams or streams[-1][-1] != expected[-1]:
        streams.append(await asyncio.wait_for(one_stream(streams[-1][-1] if streams else 0), 30))
        assert len(streams) < len(expected), streams

    assert len(streams) > 1 and all(seen for seen in streams)
    assert [cursor for seen in streams for cursor in seen] == expected


async def _scope_events(runtime: Runtime, scope: Scope) -> list[int]:
    found = await rows(runtime.db, "SELECT cursor FROM events WHERE user_id = %s AND app_id = %s ORDER BY cursor",
                       scope.user_id, scope.app_id)
    return [row["cursor"] for row in found]


async def test_after_latest_streams_only_what_commits_after_opening(
        api: ApiServer, http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    created = (await http.post("/api/v1/sessions", json={"input": script(say("history"))})).json()
    root_id = created["session"]["session_id"]
    await poll(lambda: terminal(http, created["input"]["input_id"]))
    history = await _scope_events(runtime, scope)

    for path in (f"/api/v1/sessions/{root_id}/events", f"/api/v1/trees/{root_id}/events"):
        seen: list[dict] = []
        async with http.stream("GET", path, params={"after": "latest"}) as response:
            assert response.status_code == 200, await response.aread()
            # The start is fixed once the response has begun: only what commits from now on comes.
            submitted = await http.post(f"/api/v1/sessions/{root_id}/inputs", json={"text": script(say("new"))})
            assert submitted.status_code == 202, submitted.text
            async for frame in sse_frames(response):
                if "id" in frame:
                    seen.append(json.loads(frame["data"]))
                    if seen[-1]["kind"] == "turn_completed":
                        break
        assert seen[0]["cursor"] > max(history), (seen[0], history)
        stored = await rows(runtime.db, "SELECT cursor FROM events WHERE tree_id = %s AND cursor > %s "
                            "AND cursor <= %s ORDER BY cursor", uuid.UUID(root_id), max(history), seen[-1]["cursor"])
        assert [e["cursor"] for e in seen] == [r["cursor"] for r in stored]  # nothing old, nothing lost
        assert seen[0]["kind"] == "input_received" and seen[0]["payload"]["input_id"] == submitted.json()["input_id"]
        history = await _scope_events(runtime, scope)
        await poll(lambda: _subscribers_gone(api), timeout=10)


async def test_tree_summary_cursor_resumes_the_stream_without_loss(
        http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    children = [create(f"c{i}", script(say(f"c{i} done", delay_ms=300 * (i + 1)))) for i in range(3)]
    text = script(call(*children), call(("wait_inputs", {"input_ids": [f"${{{i}.input_id}}" for i in range(3)]})),
                  say("all done"))
    created = (await http.post("/api/v1/sessions", json={"input": text})).json()
    root_id = created["session"]["session_id"]

    async def three_children() -> dict | None:
        summary = (await http.get(f"/api/v1/trees/{root_id}")).json()
        return summary if len(summary["members"]) == 4 else None

    before = await _scope_events(runtime, scope)
    summary = await poll(three_children)  # read while the children still run
    after = await _scope_events(runtime, scope)
    assert max(before) <= summary["event_cursor"] <= max(after)

    def root_done(event: dict) -> bool:
        return event["kind"] == "turn_completed" and event["session_id"] == root_id

    rest = await collect_events(http, f"/api/v1/trees/{root_id}/events", params={"after": summary["event_cursor"]},
                                until=root_done)
    stored = await rows(runtime.db, "SELECT cursor FROM events WHERE tree_id = %s AND cursor > %s AND cursor <= %s "
                        "ORDER BY cursor", uuid.UUID(root_id), summary["event_cursor"], rest[-1]["cursor"])
    assert [e["cursor"] for e in rest] == [r["cursor"] for r in stored]
    # Every member the summary did not show as finished ends after its cursor.
    unfinished = {m["session_id"] for m in summary["members"] if m["turn_status"] != "completed"}
    ended = {e["session_id"] for e in rest if e["kind"] == "turn_completed"}
    assert unfinished and unfinished <= ended


async def test_invalid_start_cursors_are_refused_and_write_nothing(
        http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    root = (await http.post("/api/v1/sessions", json={"title": "cursors"})).json()["session"]
    before = await _scope_events(runtime, scope)
    for path in (f"/api/v1/sessions/{root['session_id']}/events", f"/api/v1/trees/{root['tree_id']}/events"):
        for bad in ("-1", "abc", "Latest", "latest1", "1.5", str(2**63), ""):
            refused = await http.get(path, params={"after": bad})
            assert refused.status_code == 422, (path, bad, refused.text)
            assert isinstance(refused.json()["detail"], str)
    assert await _scope_events(runtime, scope) == before


async def test_a_last_event_id_of_other_digits_is_refused_like_any_bad_cursor(
        http: httpx.AsyncClient, runtime: Runtime, scope: Scope) -> None:
    # Header bytes decode as Latin-1: "\xb2" is "²", a digit to str.isdigit() but not to int().
    root = (await http.post("/api/v1/sessions", json={"title": "superscripts"})).json()["session"]
    before = await _scope_events(runtime, scope)
    for path in (f"/api/v1/sessions/{root['session_id']}/events", f"/api/v1/trees/{root['tree_id']}/events"):
        for bad in (b"\xb2", b"7\xb9\xb3", b"\xbd"):
            refused = await http.get(path, headers={b"Last-Event-ID": bad})
            assert refused.status_code == 422, (path, bad, refused.text)
            assert "Last-Event-ID" in refused.json()["detail"]
    assert await _scope_events(runtime, scope) == before


async def _try_stream(http: httpx.AsyncClient, path: str) -> httpx.Response:
    """Open a stream and close it at once: its status (and, refused, its body)."""
    async with http.stream("GET", path) as response:
        if response.status_code != 200:
            await response.aread()
        return response


async def _places(runtime: Runtime, api_key: str) -> int:
    found = await rows(runtime.db, "SELECT count(*) AS n FROM open_streams s JOIN api_keys k USING (key_id) "
                                   "WHERE k.key_hash = %s AND s.expires_at > now()", hash_key(api_key))
    return int(found[0]["n"])


async def test_a_key_holds_at_most_its_limit_of_streams_across_replicas(
        api: ApiServer, second_api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    limit = runtime.settings.max_streams_per_key
    assert limit == 8  # the default
    key, other_key = await runtime.create_api_key(scope), await runtime.create_api_key(scope)
    async with client(api.url, key) as on_a, client(second_api.url, key) as on_b, \
            client(api.url, other_key) as other:
        root = (await on_a.post("/api/v1/sessions", json={"title": "streams"})).json()["session"]["session_id"]
        path = f"/api/v1/trees/{root}/events"
        async with contextlib.AsyncExitStack() as open_now:
            held = [await open_now.enter_async_context((on_a if i % 2 else on_b).stream("GET", path))
                    for i in range(limit)]
            assert all(response.status_code == 200 for response in held)
            assert await _places(runtime, key) == limit
            for replica in (on_a, on_b):
                refused = await _try_stream(replica, path)
                assert refused.status_code == 429, refused.text
                detail = refused.json()["detail"]
                assert f"{limit} open event streams" in detail and "CANOPY_MAX_STREAMS_PER_KEY" in detail
            assert await _places(runtime, key) == limit  # a refusal takes no place
            assert (await _try_stream(other, path)).status_code == 200  # another key has places of its own
            await held[0].aclose()  # closing a stream frees its place
            await poll(lambda: _places_below(runtime, key, limit), timeout=10)
            assert (await _try_stream(on_b, path)).status_code == 200
        await poll(lambda: _places_below(runtime, key, 1), timeout=10)


async def _places_below(runtime: Runtime, api_key: str, bound: int) -> bool:
    return await _places(runtime, api_key) < bound


async def _places_held(runtime: Runtime, api_key: str, count: int) -> bool:
    return await _places(runtime, api_key) == count


async def test_a_revoked_key_loses_its_open_streams(api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    async with client(api.url, ADMIN_TOKEN) as admin:
        key = (await admin.post("/api/v1/admin/keys", json={"user_id": scope.user_id, "app_id": scope.app_id})).json()
        async with client(api.url, key["api_key"]) as http:
            root = (await http.post("/api/v1/sessions", json={"title": "revoked"})).json()["session"]["session_id"]
            async with http.stream("GET", f"/api/v1/sessions/{root}/events") as stream:
                assert stream.status_code == 200
                await admin.post(f"/api/v1/admin/keys/{key['key_id']}/revoke")
                # The stream ends (its heartbeat would otherwise keep it open forever).
                await asyncio.wait_for(_drain(stream.aiter_bytes()), 10)
    await poll(lambda: _places_below(runtime, key["api_key"], 1), timeout=10)


async def test_a_stream_whose_client_stopped_reading_keeps_its_place_until_it_closes(
        runtime: Runtime, scope: Scope) -> None:
    """Under uvicorn a client that stops reading blocks the stream in a send. Its place was renewed
    by the stream's generator, blocked with it, so the place expired while the stream stayed open,
    and the key could open any number of such streams."""
    settings = StreamSettings(heartbeat_seconds=30, fallback_poll_seconds=0.1, lease_seconds=2.0,
                              lease_refresh_seconds=0.5)
    app = create_app(runtime, admin_token=ADMIN_TOKEN, stream_settings=settings)
    key = await runtime.create_api_key(scope)
    session_id = (await runtime.create_root(scope, title="unread"))["session"]["session_id"]
    async with runtime.db.tx() as conn:  # a history larger than every buffer between the two ends
        for _ in range(40):
            await append_event(conn, scope, "message_added", session_id=uuid.UUID(str(session_id)),
                               payload={"text": "x" * 100_000})
    async with uvicorn_server(app) as server:
        host, port = server.url.removeprefix("http://").split(":")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect((host, int(port)))
        reader.sendall(f"GET /api/v1/sessions/{session_id}/events HTTP/1.1\r\nHost: {host}\r\n"
                       f"Authorization: Bearer {key}\r\n\r\n".encode())
        try:
            await poll(lambda: _places_held(runtime, key, 1), timeout=10)
            await asyncio.sleep(3 * settings.lease_seconds)  # never read: the stream is stuck in a send
            assert await _places(runtime, key) == 1  # and it still holds its place
        finally:
            reader.close()
        await poll(lambda: _places_below(runtime, key, 1), timeout=10)  # a closed stream frees it


async def test_a_listener_whose_connection_goes_silent_notices_and_listens_again(
        runtime: Runtime, scope: Scope) -> None:
    """A listening connection dropped without a word looked alive until the OS's keepalive gave up
    (two hours): live text stopped, events waited for the safety poll, and a revoked key stayed
    accepted from the cache. The hub asks the connection to answer, and listens again."""
    told: list[str | None] = []
    async with tcp_link(runtime.database_url) as (url, passing):
        hub = EventHub(url, reconnect_seconds=0.2, liveness_seconds=1.0, on_keys_changed=told.append)
        await hub.start()
        try:
            await poll(lambda: _true(hub.listening), timeout=20)
            passing.clear()
            await poll(lambda: _true(not hub.listening), timeout=20)
            passing.set()
            await poll(lambda: _true(hub.listening), timeout=20)
            async with runtime.db.tx() as conn:
                _, key = await scopes.issue_key(conn, scope)
                await scopes.revoke_key(conn, key["key_id"])
            await poll(lambda: _true(str(key["key_id"]) in told), timeout=20)
        finally:
            await hub.stop()


async def _true(value: bool) -> bool:
    return value


async def test_a_stream_ended_by_its_budget_keeps_its_place_while_its_client_may_still_read(
        runtime: Runtime, scope: Scope) -> None:
    """Serve hands a replica's response to its proxy without waiting for the client: a stream that
    ended by its byte budget freed its place while the proxy still held everything its client had
    not read, so a client that never reads opened stream after stream (helper's repro: 6 of them
    under a limit of 2, 100 MB held). The place is kept as long as the client takes to read what it
    was sent at the drain rate (a stream whose client went frees it at once:
    test_a_key_holds_at_most_its_limit_of_streams_across_replicas)."""
    settings = StreamSettings(heartbeat_seconds=30, fallback_poll_seconds=0.1, max_bytes=64 * 1024,
                              drain_bytes_per_second=16 * 1024)  # each budget's worth holds ~4 s
    runtime.settings.max_streams_per_key = 2
    app = create_app(runtime, admin_token=ADMIN_TOKEN, stream_settings=settings)
    key = await runtime.create_api_key(scope)
    session_id = (await runtime.create_root(scope, title="unread"))["session"]["session_id"]
    async with runtime.db.tx() as conn:  # more history than a budget
        for _ in range(10):
            await append_event(conn, scope, "message_added", session_id=uuid.UUID(str(session_id)),
                               payload={"text": "x" * 20_000})

    async def open_unread() -> tuple[int, int]:
        """A request whose every response message the proxy takes at once (Serve's send never
        waits); its client never reads, and never goes."""
        messages: list[dict[str, object]] = []
        requested = False

        async def receive() -> dict[str, object]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def send(message: dict[str, object]) -> None:
            messages.append(message)

        path = f"/api/v1/sessions/{session_id}/events"
        request = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                   "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                   "root_path": "", "headers": [(b"host", b"t"), (b"authorization", f"Bearer {key}".encode())],
                   "client": ("127.0.0.1", 1000), "server": ("127.0.0.1", 80)}
        await asyncio.wait_for(app(request, receive, send), 30)
        return int(messages[0]["status"]), sum(len(m.get("body", b"")) for m in messages)  # type: ignore[arg-type]

    try:
        async with app.router.lifespan_context(app):
            first, second = await open_unread(), await open_unread()
            assert [first[0], second[0]] == [200, 200] and first[1] >= settings.max_bytes
            assert await _places(runtime, key) == 2  # both ended, and both still hold their places
            assert (await open_unread())[0] == 429
            await poll(lambda: _places_below(runtime, key, 1), timeout=20)  # read by now at the drain rate
            assert (await open_unread())[0] == 200
    finally:
        runtime.settings.max_streams_per_key = 8


async def test_the_streams_of_an_archived_tree_end_and_their_reconnects_get_204(
        api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    """An archived tree takes no input, so nothing more happens in it: its open streams (the tree's
    and a member's) send what is left and end, freeing their places; a reconnect with nothing left
    gets 204, which stops an EventSource for good, and takes no place; one from an earlier cursor
    gets the rest, then ends. A stop is refused (409, no event); a budget change, still allowed,
    is what a reconnect from the end then gets."""
    key = await runtime.create_api_key(scope)
    async with client(api.url, key) as http:
        text = script(call(create("helper", script(say("helped")))),
                      call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("done"))
        created = (await http.post("/api/v1/sessions", json={"input": text})).json()
        root, input_id = created["session"]["session_id"], created["input"]["input_id"]
        await poll(lambda: terminal(http, input_id), timeout=60)
        [helper] = [str(r["session_id"]) for r in await rows(
            runtime.db, "SELECT session_id FROM sessions WHERE tree_id = %s AND parent_id IS NOT NULL",
            uuid.UUID(root))]

        streams = [asyncio.create_task(_read_to_the_end(http, path)) for path in
                   (f"/api/v1/trees/{root}/events", f"/api/v1/sessions/{helper}/events")]
        await poll(lambda: _places_held(runtime, key, 2), timeout=10)
        assert (await http.post(f"/api/v1/sessions/{root}/archive")).status_code == 200
        tree_events, helper_events = await asyncio.wait_for(asyncio.gather(*streams), 30)  # both ended by themselves
        await poll(lambda: _places_below(runtime, key, 1), timeout=10)

        stored = await rows(runtime.db, "SELECT cursor FROM events WHERE tree_id = %s ORDER BY cursor",
                            uuid.UUID(root))
        assert [e["cursor"] for e in tree_events] == [r["cursor"] for r in stored]  # all of it, then the end
        assert tree_events[-1]["kind"] == "tree_archived"
        assert helper_events and {e["session_id"] for e in helper_events} == {helper}

        last = str(tree_events[-1]["cursor"])
        watched = await rows(runtime.db, "SELECT count(*) AS n FROM stream_watchers WHERE tree_id = %s",
                             uuid.UUID(root))
        for path, headers in ((f"/api/v1/trees/{root}/events", {"Last-Event-ID": last}),
                              (f"/api/v1/sessions/{helper}/events", {"Last-Event-ID": last}),
                              (f"/api/v1/sessions/{root}/events?after=latest", {})):
            again = await http.get(path, headers=headers)
            assert (again.status_code, again.content) == (204, b""), (path, again.text)
            assert again.headers["cache-control"] == "no-store"  # a 204 is cacheable by default
        assert await _places(runtime, key) == 0  # a 204 takes no place and marks nothing watched
        assert await rows(runtime.db, "SELECT count(*) AS n FROM stream_watchers WHERE tree_id = %s",
                          uuid.UUID(root)) == watched

        middle = tree_events[len(tree_events) // 2]["cursor"]
        rest = await asyncio.wait_for(_read_to_the_end(http, f"/api/v1/trees/{root}/events", after=middle), 30)
        assert rest == [e for e in tree_events if e["cursor"] > middle]

        # Nothing in it runs, so it cannot be stopped (no event); its budget may still change (it
        # governs the trees it spawned), and a reconnect from the end then gets that, then ends.
        before = await rows(runtime.db, "SELECT count(*) AS n FROM events WHERE tree_id = %s", uuid.UUID(root))
        stop = await http.post(f"/api/v1/trees/{root}/stop")
        assert stop.status_code == 409 and "archived" in stop.json()["detail"], stop.text
        assert await rows(runtime.db, "SELECT count(*) AS n FROM events WHERE tree_id = %s", uuid.UUID(root)) == before
        assert (await http.patch(f"/api/v1/trees/{root}/budget", json={"max_tokens": 10_000})).status_code == 200
        changed = await asyncio.wait_for(_read_to_the_end(http, f"/api/v1/trees/{root}/events", after=int(last)), 30)
        assert [e["kind"] for e in changed] == ["tree_budget_changed"]


async def _read_to_the_end(http: httpx.AsyncClient, path: str, after: int | None = None) -> list[dict]:
    """The durable events of a stream that ends by itself."""
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200
        return [json.loads(frame["data"]) async for frame in sse_frames(response) if "id" in frame]
