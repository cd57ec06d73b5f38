"""What IdGuard leaves alone: sessionless 2026-07-28 traffic, and scopes other than HTTP."""

from __future__ import annotations

import asyncio
import json

import anyio

from harness import CALL_DEADLINE_S, client, serve, tool_call

SESSIONLESS_HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2026-07-28",
}


def sessionless_call(url: str, body: bytes) -> tuple:
    async def run() -> tuple:
        async with client() as http:
            response = await asyncio.wait_for(
                http.post(url, headers=SESSIONLESS_HEADERS, content=body), timeout=CALL_DEADLINE_S
            )
            return response.status_code, response.content

    return asyncio.run(run())


def test_sessionless_2026_07_28_traffic_passes_untouched() -> None:
    # Spaces and key order a re-serialisation would change.
    body = json.dumps(tool_call(1, "echo", {"sentinel": "untouched"}), indent=1).encode()
    with serve(guarded=True) as served:
        before = served.guard.stats()
        status, content = sessionless_call(served.url, body)
        after = served.guard.stats()
        (seen,) = served.recorder.seen
    # The app got the request as the client sent it, and the client the app's answer.
    assert seen.body == body
    sent = {name.lower(): value for name, value in SESSIONLESS_HEADERS.items()}
    for name, value in sent.items():
        assert (name.encode(), value.encode()) in seen.headers, (name, seen.headers)
    assert status == seen.status
    assert content == seen.response_body
    assert after["in_flight_requests"] == 0 and after["remapped_total"] == before["remapped_total"], after


def test_scopes_other_than_http_go_to_the_app_untouched() -> None:
    from mcp_id_guard import IdGuard

    calls = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        calls.append((scope, receive, send))

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        pass

    guard = IdGuard(app)
    for kind in ("websocket", "lifespan"):
        scope = {"type": kind, "asgi": {"version": "3.0"}, "headers": [(b"mcp-session-id", b"s")]}
        anyio.run(guard, scope, receive, send)
        assert calls[-1] == (scope, receive, send)
        assert calls[-1][0] is scope
