"""Schedule bodies over real HTTP: an interval is a JSON number, and a refused body writes no schedule."""

from __future__ import annotations

import httpx

from actors.runtime import Runtime
from persistence.records import Scope
from tests.api.helpers import rows


async def test_a_schedule_interval_refuses_booleans_and_strings(http: httpx.AsyncClient, runtime: Runtime,
                                                                 scope: Scope) -> None:
    async def stored() -> list[dict[str, object]]:
        return await rows(runtime.db, "SELECT interval_seconds FROM schedules WHERE user_id = %s", scope.user_id)

    root = (await http.post("/api/v1/sessions", json={"title": "ticking"})).json()["session"]
    path = f"/api/v1/sessions/{root['session_id']}/schedules"
    # JSON true would be an interval of one second, "60" a number the client never sent as one.
    for every in (True, False, "60", "1e3"):
        refused = await http.post(path, json={"every_seconds": every, "text": "tick"})
        assert refused.status_code == 422, (every, refused.text)
        assert "every_seconds" in refused.json()["detail"]
    assert await stored() == []
    made = await http.post(path, json={"every_seconds": 3600, "text": "tick"})
    assert made.status_code == 201, made.text
    assert made.json()["every_seconds"] == 3600
    assert await stored() == [{"interval_seconds": 3600.0}]
