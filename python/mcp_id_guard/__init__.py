"""mcp-id-guard for Python: an ASGI middleware that keeps MCP answers apart.

In a stateful MCP streamable-HTTP session the Python SDK routes each answer to
the POST that asked for it by ``str(id)`` alone, so two concurrent POSTs of one
``Mcp-Session-Id`` that carry the same JSON-RPC id (a major client sends every
call with ``id: 1``) get each other's results, or hang. ``IdGuard`` wraps the
ASGI app (``mcp.streamable_http_app()`` of FastMCP, or any streamable-HTTP
app) and gives a duplicate id a unique server-side id, restoring the client's
id in the answer (JSON or SSE); or it rejects or queues the duplicate.

Why at the ASGI level: FastMCP's own middleware and the SDK's request handlers
run after the streamable-HTTP transport has parsed the message and filed its
response stream under the request's id, which is where the two requests are
already crossed. Only a layer in front of the transport sees both requests as
HTTP requests and can change an id before the transport reads it.

Every rule (what is tracked, when an id is free, what a client is answered)
lives in the Rust crate ``mcp-id-guard``, the same code as its Tower layer and
reverse proxy, reached through the native module ``mcp_id_guard._core``. This
module only carries bytes between the ASGI server, the app and that core, and
does the awaiting (with anyio: asyncio and trio servers both work).

Use::

    from mcp_id_guard import IdGuard
    app = IdGuard(mcp.streamable_http_app())
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, Literal, MutableMapping, Optional, Tuple

import anyio

from ._core import Core, Exchange

__all__ = ["IdGuard"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Response extensions that would let the app send a body the core never sees
# (a file by path, zero-copy): taken out of the scope of a guarded exchange, so
# that the app falls back to ``http.response.body`` messages.
_BYPASSING_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopysend")


class IdGuard:
    """Pure ASGI 3 middleware: duplicate JSON-RPC ids in one MCP session are kept apart.

    ``on_duplicate``: ``"remap"`` (default; the duplicate goes to the app with a
    unique server-side id and gets its own answer with its own id back),
    ``"reject"`` (a JSON-RPC error, the app is not called) or ``"queue"`` (it
    waits until the earlier request with that id has been answered, at most
    ``max_queue_wait`` seconds, 30 by default, then ``503``). The limits are
    those of the Rust crate's ``IdGuardLayer``, and ``None`` (the default)
    takes its default: ``max_body_bytes`` of a tracked request body (4 MiB;
    ``413`` above it), ``abandoned_id_ttl`` seconds an id whose answer never
    reached its client stays remembered (300), ``max_in_flight_per_session``
    (``429``), ``max_session_id_bytes`` (``400``) and ``max_table_bytes``
    (``503``). ``max_body_memory`` bounds the bytes of all the request bodies
    being read at once (64 MiB, as the proxy), ``max_body_memory_per_client``
    one client address's share of it (half); a body that does not fit is
    answered ``503``. ASGI servers bound neither.

    Scopes other than ``"http"`` (``lifespan``, ``websocket``) go to the app
    untouched. One instance keeps one table: use it from one event loop.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        on_duplicate: Literal["remap", "reject", "queue"] = "remap",
        max_body_bytes: Optional[int] = None,
        max_queue_wait: Optional[float] = None,
        abandoned_id_ttl: Optional[float] = None,
        max_in_flight_per_session: Optional[int] = None,
        max_session_id_bytes: Optional[int] = None,
        max_table_bytes: Optional[int] = None,
        max_body_memory: Optional[int] = None,
        max_body_memory_per_client: Optional[int] = None,
    ) -> None:
        self.app = app
        self._core = Core(
            on_duplicate=on_duplicate,
            max_body_bytes=max_body_bytes,
            max_queue_wait=max_queue_wait,
            abandoned_id_ttl=abandoned_id_ttl,
            max_in_flight_per_session=max_in_flight_per_session,
            max_session_id_bytes=max_session_id_bytes,
            max_table_bytes=max_table_bytes,
            max_body_memory=max_body_memory,
            max_body_memory_per_client=max_body_memory_per_client,
        )
        # The core's setting (its default when none was given): the driver
        # times the wait, by its own clock.
        self._max_queue_wait = self._core.max_queue_wait
        # Queued exchanges waiting for their turn: token -> the event that
        # wakes the waiter. Only touched from the event loop.
        self._waiters: Dict[int, anyio.Event] = {}

    def stats(self) -> Dict[str, int]:
        """The guard's counters and gauges (``in_flight_requests``, ``remapped_total``, ...)."""
        return self._core.stats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        exchange = self._core.exchange(
            scope["method"], _header_list(scope.get("headers", ())), client[0] if client else None
        )
        try:
            await self._drive(exchange, scope, receive, send)
        finally:
            # Ends the exchange however it went: an id whose answer did not
            # pass to the client stays abandoned (the core decides).
            exchange.close()
            self._wake()

    def _wake(self) -> None:
        for token in self._core.take_woken():
            event = self._waiters.get(token)
            if event is not None:
                event.set()

    async def _drive(self, exchange: Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        action: str = exchange.action
        if action == "pass":
            await self.app(scope, receive, send)
            return
        if action == "read":
            read = await self._read_body(exchange, receive)
            if read is None:
                return  # the client left before its body was complete
            action = read
        if action == "wait":
            turn = await self._await_turn(exchange, receive)
            if turn is None:
                return  # the client left while queued
            action = turn
        if action == "answer":
            status, headers, body = exchange.answer()
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if action == "forward":
            app_receive = _replaced_body(exchange.request_body(), receive)
        elif action == "stream":
            app_receive = receive
        else:
            raise RuntimeError(f"mcp_id_guard: unknown action {action!r} from the core")
        app_scope = dict(scope)
        app_scope["headers"] = exchange.request_headers()
        extensions = scope.get("extensions")
        if extensions and any(name in extensions for name in _BYPASSING_EXTENSIONS):
            app_scope["extensions"] = {
                name: value for name, value in extensions.items() if name not in _BYPASSING_EXTENSIONS
            }
        await self.app(app_scope, app_receive, _RestoringSend(exchange, send, self))
        # The app returned with its response started and no final body
        # message (the core is still at "respond"): what the core held back
        # (a JSON answer's last piece) still goes on, and the response stays
        # as unfinished as the app left it.
        if exchange.action == "respond":
            out = exchange.response_body(b"", False)
            self._wake()
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})

    async def _read_body(self, exchange: Exchange, receive: Receive) -> Optional[str]:
        """Feeds the whole request body to the core; the next action, or None if the client left."""
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "http.disconnect":
                return None
            if kind != "http.request":
                continue
            chunk = message.get("body", b"")
            if chunk and not exchange.feed(_as_bytes(chunk)):
                return exchange.action  # over max_body_bytes: "answer"
            if not message.get("more_body", False):
                action = exchange.admit()
                self._wake()
                return action

    async def _await_turn(self, exchange: Exchange, receive: Receive) -> Optional[str]:
        """Waits while queued; "forward" or "answer", or None if the client left meanwhile."""
        gone = False
        action: Optional[str] = None
        async with anyio.create_task_group() as group:

            async def watch_disconnect() -> None:
                nonlocal gone
                # The body is complete: what receive() gives now is the
                # client's disconnect.
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        gone = True
                        group.cancel_scope.cancel()
                        return

            group.start_soon(watch_disconnect)
            try:
                action = await self._turn(exchange)
            finally:
                group.cancel_scope.cancel()
        return None if gone else action

    async def _turn(self, exchange: Exchange) -> str:
        token = exchange.token
        if token is None:
            raise RuntimeError("mcp_id_guard: the core queued a request without a token")
        deadline = anyio.current_time() + self._max_queue_wait
        event = anyio.Event()
        self._waiters[token] = event
        try:
            while True:
                action = exchange.poll_turn()
                if action != "wait":
                    return action
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    exchange.time_out()
                    # A batch that leaves the line frees its other ids.
                    self._wake()
                    return exchange.action
                with anyio.move_on_after(remaining):
                    await event.wait()
                if event.is_set():
                    event = anyio.Event()
                    self._waiters[token] = event
        finally:
            self._waiters.pop(token, None)


def _as_bytes(data: Any) -> bytes:
    return data if type(data) is bytes else bytes(data)


def _header_list(headers: Any) -> List[Tuple[bytes, bytes]]:
    """ASGI headers (an iterable of two-item iterables of bytes) as the core takes them."""
    return [(_as_bytes(name), _as_bytes(value)) for name, value in headers]


def _replaced_body(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the core's body as one message, then the server's messages."""
    delivered = False

    async def replaced() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaced


class _RestoringSend:
    """A send that routes the app's response through the core (ids restored).

    A class with slots rather than a closure: one small object per exchange,
    which every held exchange keeps for as long as its response is open.
    """

    __slots__ = ("_exchange", "_send", "_guard")

    def __init__(self, exchange: Exchange, send: Send, guard: IdGuard) -> None:
        self._exchange = exchange
        self._send = send
        self._guard = guard

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            message = dict(message)
            headers = _header_list(message.get("headers", ()))
            message["headers"] = self._exchange.response_start(message["status"], headers)
        elif kind == "http.response.body":
            more_body = bool(message.get("more_body", False))
            out = self._exchange.response_body(_as_bytes(message.get("body", b"")), more_body)
            # The answer that passed may have freed an id a queued request
            # waits for: its turn comes now, not when this stream ends.
            self._guard._wake()
            if not out and more_body:
                return  # held back: nothing to send yet
            message = dict(message)
            message["body"] = out
        await self._send(message)
