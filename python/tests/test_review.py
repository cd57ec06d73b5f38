"""What the review of the Python face found, each driven in process with
scripted ASGI apps (anyio, asyncio and trio), each failing before its fix:

- a queued duplicate's turn comes when the earlier request's answer passed,
  not when its stream ends (the wake-up after a response body was lost);
- an app that returns without a final body message still gets the bytes the
  guard held back to the client, and its id is free;
- a request outside any session with a header byte the `http` crate refuses
  (an ASGI server may pass one) goes on untouched, not refused;
- a response header the `http` crate refuses goes on as the app wrote it;
- a body after the response's last one is an error, never bytes passed on.
"""

from __future__ import annotations

import json

import anyio
import pytest

from mcp_id_guard import IdGuard

BACKENDS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]
DEADLINE_S = 5.0
SESSION = [(b"mcp-session-id", b"s-1"), (b"content-type", b"application/json")]


def scope(method: str = "POST", headers: list | None = None) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": SESSION if headers is None else headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


def call(rpc_id: int = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {}}).encode()


class Client:
    """The ASGI server's side of one request: its body, then it stays."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.given = False
        self.sent: list[dict] = []
        self.answered = anyio.Event()

    async def receive(self) -> dict:
        if not self.given:
            self.given = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.answered.set()

    def received(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def read_all(receive) -> bytes:  # noqa: ANN001
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def sse(rpc_id: object) -> bytes:
    return ("event: message\ndata: " + json.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": {}}) + "\n\n").encode()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_queued_duplicate_goes_on_when_the_earlier_answer_passed(backend: str) -> None:
    first_called = anyio.Event()
    first_may_answer = anyio.Event()
    first_stream_may_end = anyio.Event()
    calls = 0

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        nonlocal calls
        calls += 1
        first = calls == 1
        rpc_id = json.loads(await read_all(receive))["id"]
        if first:
            first_called.set()
            await first_may_answer.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": sse(rpc_id), "more_body": True})
        if first:
            # The server keeps the first POST's stream open after its answer.
            await first_stream_may_end.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def run() -> None:
        guard = IdGuard(app, on_duplicate="queue", max_queue_wait=30)
        a, b = Client(call(1)), Client(call(1))
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as group:
                group.start_soon(guard, scope(), a.receive, a.send)
                await first_called.wait()
                group.start_soon(guard, scope(), b.receive, b.send)
                while guard.stats()["queued_total"] < 1:
                    await anyio.sleep(0)  # a checkpoint, not a timed wait: B reaches the queue
                first_may_answer.set()
                # B gets its answer while A's stream is still open.
                await b.answered.wait()
                assert not first_stream_may_end.is_set()
                first_stream_may_end.set()
        assert json.loads(b.received().split(b"data: ")[1])["id"] == 1

    anyio.run(run, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_app_that_returns_without_a_final_body_loses_nothing(backend: str) -> None:
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}).encode()

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        await read_all(receive)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer, "more_body": True})
        # ...and returns: the server ends the response (its length is met).

    async def run() -> None:
        guard = IdGuard(app)
        client = Client(call(1))
        with anyio.fail_after(DEADLINE_S):
            await guard(scope(), client.receive, client.send)
        assert client.received() == answer
        stats = guard.stats()
        assert stats["abandoned_ids"] == 0 and stats["in_flight_requests"] == 0, stats

    anyio.run(run, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_header_bytes_outside_a_session_pass_and_inside_one_are_refused(backend: str) -> None:
    seen: list[list] = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        seen.append(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-odd", b"a\x01b")]})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    async def run() -> None:
        guard = IdGuard(app)
        odd = [(b"x-odd", b"a\x7fb")]
        outside = Client(b"")
        with anyio.fail_after(DEADLINE_S):
            await guard(scope("GET", odd), outside.receive, outside.send)
        assert outside.sent[0]["status"] == 200 and outside.received() == b"ok"
        assert outside.sent[0]["headers"] == [(b"x-odd", b"a\x01b")], "the app's header goes on"
        assert seen == [odd]
        inside = Client(call(1))
        with anyio.fail_after(DEADLINE_S):
            await guard(scope("POST", SESSION + odd), inside.receive, inside.send)
        assert inside.sent[0]["status"] == 400 and len(seen) == 1, "in a session: refused, the app not called"

    anyio.run(run, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_body_after_the_last_one_is_an_error(backend: str) -> None:
    async def app(scope, receive, send) -> None:  # noqa: ANN001
        rpc_id = json.loads(await read_all(receive))["id"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await send({"type": "http.response.body", "body": sse(rpc_id), "more_body": False})

    async def run() -> None:
        guard = IdGuard(app)
        client = Client(call(1))
        with anyio.fail_after(DEADLINE_S), pytest.raises(RuntimeError, match="out of turn"):
            await guard(scope(), client.receive, client.send)
        assert client.received() == b"", "nothing of the late body reached the client"
        assert guard.stats()["in_flight_requests"] == 0

    anyio.run(run, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bodies_being_read_are_bounded_per_client_and_in_all(backend: str) -> None:
    """Bodies still arriving hold the budget (uvicorn bounds none): past a
    client's share the next one is answered 503 while another client's goes on;
    a body that left frees its share."""
    calls = 0

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        nonlocal calls
        calls += 1
        await read_all(receive)
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    class Trickle:
        """A client whose body arrives in two parts, the second when let go."""

        def __init__(self, first: bytes, rest: bytes) -> None:
            self.parts = [first, rest]
            self.go = anyio.Event()
            self.reading = anyio.Event()
            self.sent: list[dict] = []

        async def receive(self) -> dict:
            part = self.parts.pop(0)
            if self.parts:
                return {"type": "http.request", "body": part, "more_body": True}
            self.reading.set()
            await self.go.wait()
            return {"type": "http.request", "body": part, "more_body": False}

        async def send(self, message: dict) -> None:
            self.sent.append(message)

    def at(address: str) -> dict:
        return {**scope(), "client": (address, 50000)}

    body = call(1) + b" " * 3000

    async def run() -> None:
        # A body joined from parts is charged for its buffer, which may be
        # twice what arrived: the held one below takes up to 6 KiB.
        guard = IdGuard(app, max_body_memory=32768, max_body_memory_per_client=8192)
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as group:
                held = Trickle(body[:3000], body[3000:])
                group.start_soon(guard, at("10.0.0.1"), held.receive, held.send)
                await held.reading.wait()
                # The same address, 6000 more bytes: over its 8192 share.
                refused = Client(b"x" * 6000)
                await guard(at("10.0.0.1"), refused.receive, refused.send)
                assert refused.sent[0]["status"] == 503, refused.sent
                assert b"-32603" in refused.received() or b"-32000" in refused.received()
                # Another address fits.
                other = Client(call(2))
                await guard(at("10.0.0.2"), other.receive, other.send)
                assert other.sent[0]["status"] == 202
                held.go.set()
        assert held.sent[0]["status"] == 202
        # Every charge went back: the first address can send again.
        again = Client(b"x" * 3000 + call(3))
        with anyio.fail_after(DEADLINE_S):
            await guard(at("10.0.0.1"), again.receive, again.send)
        assert again.sent[0]["status"] != 503

    anyio.run(run, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_get_restores_the_clients_id_and_a_cancelled_id_can_be_reused(backend: str) -> None:
    """A duplicate goes to the app remapped; a GET resuming its stream replays
    the answer under the server-side id and the client reads its own id. Then
    the first call is cancelled (`notifications/cancelled`, which the app
    ignores, as a handler may) and id 1 is sent again: it gets its own answer,
    never the cancelled call's."""
    first_called = anyio.Event()
    seen_ids: list = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        if scope["method"] == "GET":
            # Replays the remapped call's answer, as an event store does.
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b"id: 7\n" + sse(seen_ids[1]), "more_body": False})
            return
        message = json.loads(await read_all(receive))
        if "id" not in message:  # a notification
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        seen_ids.append(message["id"])
        if len(seen_ids) == 1:
            first_called.set()
            await anyio.sleep_forever()  # never answers, cancelled or not
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": sse(message["id"]), "more_body": False})

    def answer_id(client: Client) -> object:
        return json.loads(client.received().split(b"data: ")[1])["id"]

    async def run() -> None:
        guard = IdGuard(app)
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as group:
                first = Client(call(1))
                group.start_soon(guard, scope(), first.receive, first.send)
                await first_called.wait()
                second = Client(call(1))
                await guard(scope(), second.receive, second.send)
                assert seen_ids[1] != 1 and answer_id(second) == 1, (seen_ids, second.received())
                resumed = Client(b"")
                get = scope("GET", SESSION + [(b"last-event-id", b"3"), (b"accept", b"text/event-stream")])
                await guard(get, resumed.receive, resumed.send)
                assert answer_id(resumed) == 1, resumed.received()
                cancel = json.dumps(
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
                ).encode()
                note = Client(cancel)
                await guard(scope(), note.receive, note.send)
                assert note.sent[0]["status"] == 202
                third = Client(call(1))
                await guard(scope(), third.receive, third.send)
                assert answer_id(third) == 1 and seen_ids[2] != 1, (seen_ids, third.received())
                group.cancel_scope.cancel()

    anyio.run(run, backend=backend)
