"""The driver's side of the `_core` contract, with a scripted stand-in for the core.

The stand-in decides nothing: each test scripts the actions and records the
calls, so that these tests check only what IdGuard owes the core whatever it
decides: `close()` exactly once on every way out (the body cut short, the app
failing, `send` failing, cancellation, a client leaving a queue), the body the
core gives replacing the client's, every response byte through the core, the
last body message sent even when empty, and a queued request woken by
`take_woken()` or answered when `max_queue_wait` passes. Each runs on asyncio
and on trio.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import anyio
import pytest

import mcp_id_guard

BACKENDS = ["asyncio", "trio"]


class FakeExchange:
    def __init__(self, core: "FakeCore", action: str) -> None:
        self.core = core
        self.action = action
        self.token = 7
        self.fed: List[bytes] = []
        self.closed = 0
        self.after_admit = "forward"
        self.feed_limit: Optional[int] = None
        self.turns: List[str] = []  # what poll_turn() returns, in order (then the last one)
        self.held: Callable[[bytes, bool], bytes] = lambda chunk, more: chunk.upper()

    def feed(self, chunk: bytes) -> bool:
        self.core.log.append(("feed", chunk))
        self.fed.append(chunk)
        if self.feed_limit is not None and sum(map(len, self.fed)) > self.feed_limit:
            self.action = "answer"
            return False
        return True

    def admit(self) -> str:
        self.core.log.append(("admit",))
        self.action = self.after_admit
        return self.action

    def request_headers(self) -> list:
        return [(b"x-core", b"headers")]

    def request_body(self) -> bytes:
        return b"core-body"

    def answer(self) -> tuple:
        return 413, [(b"content-type", b"application/json")], b'{"answer":true}'

    def response_start(self, status: int, headers: list) -> list:
        self.core.log.append(("response_start", status))
        return headers + [(b"x-restored", b"1")]

    def response_body(self, chunk: bytes, more_body: bool) -> bytes:
        self.core.log.append(("response_body", chunk, more_body))
        return self.held(chunk, more_body)

    def poll_turn(self) -> str:
        self.core.log.append(("poll_turn",))
        if len(self.turns) > 1:
            self.action = self.turns.pop(0)
        elif self.turns:
            self.action = self.turns[0]
        return self.action

    def time_out(self) -> None:
        self.core.log.append(("time_out",))
        self.action = "answer"

    def close(self) -> None:
        self.core.log.append(("close",))
        self.closed += 1


class FakeCore:
    script: Callable[["FakeExchange"], None] = staticmethod(lambda exchange: None)
    first_action = "read"

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.log: List[tuple] = []
        self.exchanges: List[FakeExchange] = []
        self.woken: List[int] = []

    @property
    def max_queue_wait(self) -> float:
        # As the real core: the given setting, else the crate's default.
        wait = self.options.get("max_queue_wait")
        return 30.0 if wait is None else wait

    def stats(self) -> Dict[str, int]:
        return {}

    def exchange(self, method: str, headers: list, client: object = None) -> FakeExchange:
        exchange = FakeExchange(self, type(self).first_action)
        type(self).script(exchange)
        self.exchanges.append(exchange)
        return exchange

    def take_woken(self) -> List[int]:
        self.log.append(("take_woken",))
        woken, self.woken = self.woken, []
        return woken


def guard_with(monkeypatch: pytest.MonkeyPatch, app: Any, first: str = "read", script: Any = None, **options: Any):
    class Core(FakeCore):
        first_action = first

    if script is not None:
        Core.script = staticmethod(script)
    monkeypatch.setattr(mcp_id_guard, "Core", Core)
    guard = mcp_id_guard.IdGuard(app, **options)
    return guard, guard._core


def http_scope(**extra: Any) -> dict:
    return {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"mcp-session-id", b"s")], **extra}


def receiver(messages: List[dict]) -> Callable[[], Any]:
    """receive(): the given messages, then a disconnect that waits for ever (as a server's does until it comes)."""
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    return receive


class Sent:
    def __init__(self) -> None:
        self.messages: List[dict] = []

    async def __call__(self, message: dict) -> None:
        self.messages.append(message)


def body(chunk: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": chunk, "more_body": more}


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_body_replaced_and_response_through_the_core(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    got: Dict[str, Any] = {}

    async def app(scope: dict, receive: Any, send: Any) -> None:
        got["headers"] = scope["headers"]
        got["extensions"] = scope.get("extensions")
        got["first"] = await receive()
        got["second"] = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"held", "more_body": True})
        await send({"type": "http.response.body", "body": b"data", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def script(exchange: FakeExchange) -> None:
        exchange.held = lambda chunk, more: b"" if chunk == b"held" else chunk.upper()

    guard, core = guard_with(monkeypatch, app, script=script)
    sent = Sent()
    scope = http_scope(extensions={"http.response.pathsend": {}, "other": {}})
    disconnect = {"type": "http.disconnect"}
    anyio.run(guard, scope, receiver([body(b"a", True), body(b"b"), disconnect]), sent, backend=backend)

    (exchange,) = core.exchanges
    assert exchange.fed == [b"a", b"b"] and exchange.closed == 1
    assert got["headers"] == [(b"x-core", b"headers")]
    assert got["extensions"] == {"other": {}}  # no way around the core's response path
    assert got["first"] == {"type": "http.request", "body": b"core-body", "more_body": False}
    assert got["second"] == disconnect  # then the server's own messages
    assert [m["type"] for m in sent.messages] == ["http.response.start", "http.response.body", "http.response.body"]
    assert (b"x-restored", b"1") in sent.messages[0]["headers"]
    # The held chunk sent nothing; the last (empty) one was still sent, ending the response.
    assert [(m["body"], m["more_body"]) for m in sent.messages[1:]] == [(b"DATA", True), (b"", False)]
    assert ("take_woken",) in core.log[core.log.index(("admit",)) :]
    assert core.log[-2:] == [("close",), ("take_woken",)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_disconnect_before_the_body_is_complete(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    called = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        called.append(scope)

    guard, core = guard_with(monkeypatch, app)
    sent = Sent()
    anyio.run(guard, http_scope(), receiver([body(b"a", True), {"type": "http.disconnect"}]), sent, backend=backend)
    assert not called and not sent.messages
    assert core.exchanges[0].closed == 1 and ("admit",) not in core.log


@pytest.mark.parametrize("backend", BACKENDS)
def test_over_the_body_limit_stops_reading_and_answers(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    called = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        called.append(scope)

    def script(exchange: FakeExchange) -> None:
        exchange.feed_limit = 3

    guard, core = guard_with(monkeypatch, app, script=script)
    sent = Sent()
    messages = [body(b"ab", True), body(b"cd", True), body(b"never read", True)]
    anyio.run(guard, http_scope(), receiver(messages), sent, backend=backend)
    assert not called
    assert core.exchanges[0].fed == [b"ab", b"cd"] and core.exchanges[0].closed == 1
    assert sent.messages == [
        {"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]},
        {"type": "http.response.body", "body": b'{"answer":true}', "more_body": False},
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["app", "send"])
def test_failures_propagate_after_close(monkeypatch: pytest.MonkeyPatch, backend: str, where: str) -> None:
    class Boom(Exception):
        pass

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        if where == "app":
            raise Boom()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def failing_send(message: dict) -> None:
        raise Boom()

    guard, core = guard_with(monkeypatch, app)
    with pytest.raises(Boom):
        anyio.run(guard, http_scope(), receiver([body(b"x")]), failing_send, backend=backend)
    assert core.exchanges[0].closed == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelled_app_closes_the_exchange(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await anyio.sleep_forever()

    guard, core = guard_with(monkeypatch, app)

    async def run() -> None:
        with anyio.move_on_after(0.05):
            await guard(http_scope(), receiver([body(b"x")]), Sent())

    anyio.run(run, backend=backend)
    assert core.exchanges[0].closed == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_queued_request_woken_by_take_woken(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    bodies = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        bodies.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def script(exchange: FakeExchange) -> None:
        exchange.after_admit = "wait"
        exchange.turns = ["wait", "wait", "forward"]

    guard, core = guard_with(monkeypatch, app, script=script, max_queue_wait=30.0)

    async def run() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(guard, http_scope(), receiver([body(b"x")]), Sent())
            # Until the waiter waits (polled its turn once), then two wake-ups.
            with anyio.fail_after(5):
                while guard._waiters.get(7) is None:
                    await anyio.sleep(0)
                for _ in range(2):
                    event = guard._waiters[7]
                    core.woken.append(7)
                    guard._wake()
                    assert event.is_set()
                    while 7 in guard._waiters and guard._waiters[7] is event:
                        await anyio.sleep(0)

    anyio.run(run, backend=backend)
    assert bodies == [b"core-body"]
    assert core.log.count(("poll_turn",)) == 3 and core.exchanges[0].closed == 1
    assert not guard._waiters


@pytest.mark.parametrize("backend", BACKENDS)
def test_queued_request_times_out_into_the_cores_answer(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    called = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        called.append(scope)

    def script(exchange: FakeExchange) -> None:
        exchange.after_admit = "wait"
        exchange.turns = ["wait"]

    guard, core = guard_with(monkeypatch, app, script=script, max_queue_wait=0.05)
    sent = Sent()
    anyio.run(guard, http_scope(), receiver([body(b"x")]), sent, backend=backend)
    assert not called and ("time_out",) in core.log
    assert sent.messages[0]["status"] == 413 and sent.messages[-1]["more_body"] is False
    assert core.exchanges[0].closed == 1 and not guard._waiters


@pytest.mark.parametrize("backend", BACKENDS)
def test_client_leaving_the_queue(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    called = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        called.append(scope)

    def script(exchange: FakeExchange) -> None:
        exchange.after_admit = "wait"
        exchange.turns = ["wait"]

    guard, core = guard_with(monkeypatch, app, script=script, max_queue_wait=30.0)
    sent = Sent()
    anyio.run(guard, http_scope(), receiver([body(b"x"), {"type": "http.disconnect"}]), sent, backend=backend)
    assert not called and not sent.messages
    assert ("time_out",) not in core.log
    assert core.exchanges[0].closed == 1 and not guard._waiters


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("first", ["pass", "stream"])
def test_pass_and_stream_give_the_app_the_original_receive(
    monkeypatch: pytest.MonkeyPatch, backend: str, first: str
) -> None:
    seen: Dict[str, Any] = {}
    original = receiver([body(b"original")])

    async def app(scope: dict, receive: Any, send: Any) -> None:
        seen["receive"] = receive
        seen["headers"] = scope["headers"]
        seen["send"] = send

    sent = Sent()
    guard, core = guard_with(monkeypatch, app, first=first)
    anyio.run(guard, http_scope(), original, sent, backend=backend)
    assert seen["receive"] is original and core.exchanges[0].closed == 1
    if first == "pass":
        assert seen["send"] is sent and seen["headers"] == http_scope()["headers"]
    else:
        assert seen["send"] is not sent and seen["headers"] == [(b"x-core", b"headers")]
    assert not core.exchanges[0].fed
