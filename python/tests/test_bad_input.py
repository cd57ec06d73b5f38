"""Bad input is answered as the Rust tower layer answers it, and the app is not called."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from harness import CALL_DEADLINE_S, HEADERS, client, open_session, serve, tool_call, tool_calls_seen

SMALL_BODY_LIMIT = 2048
SMALL_SESSION_ID_LIMIT = 16


def post(url: str, headers: dict, content: object, session: bool = True) -> tuple:
    """Opens a session (or not), sends one POST; status and parsed JSON body."""

    async def run() -> tuple:
        async with client() as http:
            extra = {}
            if session:
                extra["mcp-session-id"] = await open_session(http, url)
            body = content() if callable(content) else content
            response = await asyncio.wait_for(
                http.post(url, headers={**HEADERS, **extra, **headers}, content=body), timeout=CALL_DEADLINE_S
            )
            return response.status_code, response.headers, response.content

    status, response_headers, body = asyncio.run(run())
    try:
        message = json.loads(body)
    except json.JSONDecodeError:
        message = None
    return status, response_headers, message


def test_invalid_json_is_400_with_a_parse_error() -> None:
    with serve(guarded=True) as served:
        status, _, message = post(served.url, {}, b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{')
        assert tool_calls_seen(served.recorder) == 0
    assert status == 400, message
    assert message["jsonrpc"] == "2.0" and message["id"] is None, message
    assert message["error"]["code"] == -32700, message


def big_call() -> bytes:
    body = json.dumps(tool_call(1, "echo", {"sentinel": "x" * (2 * SMALL_BODY_LIMIT)})).encode()
    assert len(body) > SMALL_BODY_LIMIT
    return body


def test_body_over_max_body_bytes_by_content_length_is_413() -> None:
    with serve(guarded=True, max_body_bytes=SMALL_BODY_LIMIT) as served:
        status, _, message = post(served.url, {}, big_call())
        assert tool_calls_seen(served.recorder) == 0
    assert status == 413, message
    assert message["id"] is None and message["error"]["code"] == -32600, message


def test_body_over_max_body_bytes_while_reading_is_413() -> None:
    # No Content-Length: chunked, the limit is found while reading.
    def chunked() -> AsyncIterator[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            body = big_call()
            for start in range(0, len(body), 512):
                yield body[start : start + 512]

        return chunks()

    with serve(guarded=True, max_body_bytes=SMALL_BODY_LIMIT) as served:
        status, _, message = post(served.url, {}, chunked)
        assert tool_calls_seen(served.recorder) == 0
    assert status == 413, message
    assert message["id"] is None and message["error"]["code"] == -32600, message


def test_session_id_over_max_session_id_bytes_is_400() -> None:
    long_session = "s" * (4 * SMALL_SESSION_ID_LIMIT)
    with serve(guarded=True, max_session_id_bytes=SMALL_SESSION_ID_LIMIT) as served:
        body = json.dumps(tool_call(1, "echo", {"sentinel": "x"})).encode()
        status, _, message = post(served.url, {"mcp-session-id": long_session}, body, session=False)
        assert tool_calls_seen(served.recorder) == 0
    assert status == 400, message
    # The tower layer's answer carries the request's id (or null).
    assert message["id"] in (1, None) and message["error"]["code"] == -32600, message
