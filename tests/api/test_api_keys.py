"""API keys over real HTTP on two API replicas (one database): revocation answers 401 at once on
both, expiry, the last use written at most about once a minute, the operators' listing, and
keys refused anywhere but the Authorization header."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import httpx

from actors.runtime import Runtime
from persistence.records import Scope
from tests.api.conftest import ApiServer
from tests.api.helpers import ADMIN_TOKEN, client, rows


async def _new_key(api: ApiServer, scope: Scope, **expiry: object) -> dict:
    async with client(api.url, ADMIN_TOKEN) as admin:
        created = await admin.post("/api/v1/admin/keys", json={"user_id": scope.user_id, "app_id": scope.app_id,
                                                               **expiry})
    assert created.status_code == 201, created.text
    return created.json()


async def _status(api: ApiServer, api_key: str, path: str = "/api/v1/projects") -> int:
    async with client(api.url, api_key) as http:
        return (await http.get(path)).status_code


async def _key_row(runtime: Runtime, key_id: str) -> dict:
    found = await rows(runtime.db, "SELECT * FROM api_keys WHERE key_id = %s", uuid.UUID(key_id))
    assert len(found) == 1
    return found[0]


async def test_a_revoked_key_answers_401_at_once_on_every_replica(
        api: ApiServer, second_api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    key = await _new_key(api, scope)
    other = await _new_key(api, scope)
    assert set(key) >= {"api_key", "key_id", "user_id", "app_id", "created_at", "expires_at"}
    assert key["expires_at"] is None and key["revoked_at"] is None
    for replica in (api, second_api):  # both replicas now hold the key in their caches
        assert await _status(replica, key["api_key"]) == 200
    async with client(api.url, ADMIN_TOKEN) as admin:
        revoked = await admin.post(f"/api/v1/admin/keys/{key['key_id']}/revoke")
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["key_id"] == key["key_id"] and revoked.json()["revoked_at"]
        for replica in (api, second_api):
            answer = await _status(replica, key["api_key"])
            assert answer == 401, replica.url
        again = await admin.post(f"/api/v1/admin/keys/{key['key_id']}/revoke")
        assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
        unknown = await admin.post(f"/api/v1/admin/keys/{uuid.uuid4()}/revoke")
        assert unknown.status_code == 404 and "no API key" in unknown.json()["detail"]
        assert (await admin.post("/api/v1/admin/keys/not-an-id/revoke")).status_code == 422
    assert await _status(api, other["api_key"]) == 200  # the scope's other key is untouched
    # Only the admin token revokes: the other key cannot, and its row stays as it was.
    async with client(api.url, other["api_key"]) as http:
        assert (await http.post(f"/api/v1/admin/keys/{other['key_id']}/revoke")).status_code == 401
    assert (await _key_row(runtime, other["key_id"]))["revoked_at"] is None


async def test_a_key_expires_when_its_creator_said(api: ApiServer, second_api: ApiServer, runtime: Runtime,
                                                   scope: Scope) -> None:
    short = await _new_key(api, scope, expires_in_seconds=3)
    assert short["expires_at"] is not None
    for replica in (api, second_api):
        assert await _status(replica, short["api_key"]) == 200
    await asyncio.sleep(3.5)
    for replica in (api, second_api):  # cached on both, refused on both
        assert await _status(replica, short["api_key"]) == 401
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    dated = await _new_key(api, scope, expires_at=later.isoformat())
    assert dt.datetime.fromisoformat(dated["expires_at"]) == later
    assert await _status(api, dated["api_key"]) == 200

    before = await rows(runtime.db, "SELECT key_id FROM api_keys WHERE user_id = %s", scope.user_id)
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    async with client(api.url, ADMIN_TOKEN) as admin:
        for bad in ({"expires_at": past}, {"expires_in_seconds": 0}, {"expires_at": "2030-01-01T00:00:00"},
                    {"expires_in_seconds": 60, "expires_at": later.isoformat()}, {"expires_in_seconds": True},
                    {"expires_in_seconds": "60"}, {"expires_at": "9999-12-31T23:59:59-01:00"},
                    {"expires_at": (later + dt.timedelta(days=3660)).isoformat()}):
            refused = await admin.post("/api/v1/admin/keys",
                                       json={"user_id": scope.user_id, "app_id": scope.app_id, **bad})
            assert refused.status_code == 422, (bad, refused.text)
    # A key's life has the same bound either way (past year 9999, psycopg cannot read the key back).
    assert "ten years" in refused.json()["detail"]
    assert await rows(runtime.db, "SELECT key_id FROM api_keys WHERE user_id = %s", scope.user_id) == before


async def test_the_last_use_is_written_at_most_about_once_a_minute(
        api: ApiServer, second_api: ApiServer, runtime: Runtime, scope: Scope) -> None:
    key = await _new_key(api, scope)
    assert (await _key_row(runtime, key["key_id"]))["last_used_at"] is None
    assert await _status(api, key["api_key"]) == 200
    first = (await _key_row(runtime, key["key_id"]))["last_used_at"]
    assert first is not None
    async with client(api.url, key["api_key"]) as http:
        for _ in range(20):
            assert (await http.get("/api/v1/projects")).status_code == 200
    assert await _status(second_api, key["api_key"]) == 200  # a database lookup, but the use is recent
    assert (await _key_row(runtime, key["key_id"]))["last_used_at"] == first

    # A use older than a minute is written again by the next lookup (the other replica has not
    # cached it since: a fresh key it never saw).
    fresh = await _new_key(api, scope)
    assert await _status(api, fresh["api_key"]) == 200
    async with runtime.db.tx() as conn:
        await conn.execute("UPDATE api_keys SET last_used_at = now() - interval '2 minutes' WHERE key_id = %s",
                           (uuid.UUID(fresh["key_id"]),))
    stale = (await _key_row(runtime, fresh["key_id"]))["last_used_at"]
    assert await _status(second_api, fresh["api_key"]) == 200
    assert (await _key_row(runtime, fresh["key_id"]))["last_used_at"] > stale


async def test_operators_list_keys_without_the_keys(api: ApiServer, scope: Scope) -> None:
    first = await _new_key(api, scope)
    second = await _new_key(api, scope, expires_in_seconds=3600)
    async with client(api.url, ADMIN_TOKEN) as admin:
        await admin.post(f"/api/v1/admin/keys/{first['key_id']}/revoke")
        listed = await admin.get("/api/v1/admin/keys", params={"user_id": scope.user_id})
    assert listed.status_code == 200, listed.text
    entries = listed.json()
    assert [entry["key_id"] for entry in entries] == [first["key_id"], second["key_id"]]
    assert set(entries[0]) == {"key_id", "user_id", "app_id", "created_at", "expires_at", "last_used_at",
                               "revoked_at"}
    assert entries[0]["revoked_at"] and entries[1]["revoked_at"] is None and entries[1]["expires_at"]
    assert first["api_key"] not in listed.text and second["api_key"] not in listed.text
    async with client(api.url, second["api_key"]) as http:  # an API key does not list keys
        assert (await http.get("/api/v1/admin/keys")).status_code == 401


async def test_operators_list_keys_a_page_at_a_time(api: ApiServer, scope: Scope) -> None:
    made = [(await _new_key(api, scope))["key_id"] for _ in range(3)]
    async with client(api.url, ADMIN_TOKEN) as admin:
        pages = [(await admin.get("/api/v1/admin/keys", params={"user_id": scope.user_id, **page})).json()
                 for page in ({"limit": 2}, {"offset": 2, "limit": 2}, {"offset": 3})]
        too_long = await admin.get("/api/v1/admin/keys", params={"limit": 1001})
    assert [[entry["key_id"] for entry in page] for page in pages] == [made[:2], made[2:], []]
    assert too_long.status_code == 422 and "1000" in too_long.text


async def test_keys_in_query_parameters_are_refused(api: ApiServer, http: httpx.AsyncClient, scope: Scope) -> None:
    key = (await _new_key(api, scope))["api_key"]
    root = (await http.post("/api/v1/sessions", json={"title": "query keys"})).json()["session"]["session_id"]
    async with client(api.url, None) as anon:
        for path in ("/api/v1/projects", f"/api/v1/sessions/{root}", f"/api/v1/trees/{root}/events"):
            for name in ("key", "api_key", "apikey", "access_token", "token", "authorization"):
                answer = await anon.get(path, params={name: key})
                assert answer.status_code == 401, (path, name)
                answer = await anon.get(path, params={name: f"Bearer {key}"})
                assert answer.status_code == 401, (path, name)
