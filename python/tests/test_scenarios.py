"""The shared scenario table: IdGuard answers it byte for byte as the Rust faces do.

``tests/scenarios/answers.json`` (at the repository root) holds requests the
guard answers itself and the exact answer to each; the Rust test
``tests/guard/scenarios.rs`` checks the tower layer and the sans-IO core
against it, this one the ASGI middleware. In a scenario every request but
the last is admitted and held in flight (the app never answers it); the last
gets the guard's own answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from mcp_id_guard import IdGuard

TABLE = Path(__file__).resolve().parents[2] / "tests" / "scenarios" / "answers.json"
SCENARIOS = json.loads(TABLE.read_text())
DEADLINE_S = 5.0


def scope(request: dict) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request["method"],
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": [(name.encode(), value.encode()) for name, value in request["headers"]],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


def receiving(body: str):
    """A receive that gives the body once, then waits (the client stays)."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body.encode(), "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    return receive


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_the_middleware_answers_as_the_rust_faces(scenario: dict) -> None:
    options = {"on_duplicate": scenario["on_duplicate"]}
    for name in ("max_body_bytes", "max_session_id_bytes"):
        if name in scenario:
            options[name] = scenario[name]
    *held, last = scenario["requests"]

    async def run() -> list:
        called = 0
        reached = anyio.Event()

        async def app(scope, receive, send) -> None:  # noqa: ANN001
            nonlocal called
            called += 1
            if called == len(held):
                reached.set()
            await anyio.sleep_forever()

        guard = IdGuard(app, **options)

        async def no_send(message: dict) -> None:
            raise AssertionError(f"a held request got an answer: {message}")

        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as group:
                for request in held:
                    group.start_soon(guard, scope(request), receiving(request["body"]), no_send)
                if held:
                    await reached.wait()
                sent: list = []

                async def send(message: dict) -> None:
                    sent.append(message)

                await guard(scope(last), receiving(last["body"]), send)
                assert called == len(held), "the app was called for the last request"
                group.cancel_scope.cancel()
        return sent

    sent = anyio.run(run)
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    answer = scenario["answer"]
    assert start["status"] == answer["status"]
    headers = [
        [name.decode(), value.decode()] for name, value in start["headers"] if name.lower() != b"content-length"
    ]
    assert headers == [list(pair) for pair in answer["headers"]]
    assert b"".join(message["body"] for message in bodies).decode() == answer["body"]
    assert not bodies[-1].get("more_body", False)
