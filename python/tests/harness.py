"""Servers and an MCP client for the tests: real ASGI servers on loopback, bounded everywhere.

The server runs on a thread of the test process (uvicorn on asyncio, or
hypercorn on trio), on a socket bound to 127.0.0.1 port 0 (the kernel picks)
and listening before the server starts, so a client that connects at once
waits in the backlog and is never refused. The client is httpx on asyncio,
with `trust_env=False` (no proxy variable may send this traffic off the
machine) and a wall-clock deadline on every call: an orphaned SSE stream gets
keep-alive pings forever, so a read timeout alone would not end it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Iterator, List, MutableMapping, Optional

import httpx

# The client side the packaging checks already have (the handshake, reading
# an answer out of SSE or JSON, comparing ids): one copy, in packaging/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packaging"))
from burst import open_session as _open_session  # noqa: E402
from burst import read_response, same_id  # noqa: E402

CALLS = 12
# Longest a single call may take. The tool sleeps at most 0.5 s; the rest is
# room for a slow, shared CI machine. A hung call costs this much once.
CALL_DEADLINE_S = 8.0
STARTUP_DEADLINE_S = 30.0
STOP_DEADLINE_S = 15.0
PROTOCOL_VERSION = "2025-06-18"
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": PROTOCOL_VERSION,
}

ASGIApp = Callable[..., Awaitable[None]]


# ---------------------------------------------------------------------------
# What the app behind the guard saw


@dataclass
class Seen:
    method: str
    path: str
    headers: List[tuple]
    body: bytes = b""
    status: Optional[int] = None
    response_headers: List[tuple] = field(default_factory=list)
    response_body: bytes = b""


class Recorder:
    """ASGI wrapper that records each HTTP request the app gets and the response it sends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: List[Seen] = []

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = Seen(scope["method"], scope["path"], [tuple(h) for h in scope.get("headers", ())])
        self.seen.append(record)

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                record.body += message.get("body", b"")
            return message

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                record.response_headers = [tuple(h) for h in message.get("headers", ())]
            elif message["type"] == "http.response.body":
                record.response_body += message.get("body", b"")
            await send(message)

        await self.app(scope, recording_receive, recording_send)


# ---------------------------------------------------------------------------
# Servers


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _wait_for(condition: Callable[[], bool], thread: threading.Thread, what: str) -> None:
    """Polls a condition until it holds, the server thread dies or the deadline passes."""
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while not condition():
        if not thread.is_alive():
            raise RuntimeError(f"{what} stopped before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {STARTUP_DEADLINE_S:.0f} s")
        time.sleep(0.01)


@contextlib.contextmanager
def uvicorn_server(app: ASGIApp) -> Iterator[str]:
    """Serves the app with uvicorn (asyncio) on a thread; yields its base URL."""
    import uvicorn

    sock = _listening_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        _wait_for(lambda: server.started, thread, "uvicorn")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_DEADLINE_S)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn did not stop within {STOP_DEADLINE_S:.0f} s")


@contextlib.contextmanager
def hypercorn_trio_server(app: ASGIApp) -> Iterator[str]:
    """Serves the app with hypercorn's trio worker on a thread; yields its base URL."""
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    sock = _listening_socket()
    port = sock.getsockname()[1]
    config = Config()
    # hypercorn takes over the descriptor it is given: a duplicate of ours.
    config.bind = [f"fd://{os.dup(sock.fileno())}"]
    config.graceful_timeout = 2.0
    config.loglevel = "WARNING"
    state: Dict[str, Any] = {}
    failure: List[BaseException] = []

    async def main() -> None:
        state["stop"] = trio.Event()
        state["token"] = trio.lowlevel.current_trio_token()

        async def started_when_serving(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            await serve(app, config, shutdown_trigger=state["stop"].wait, task_status=task_status)

        async with trio.open_nursery() as nursery:
            await nursery.start(started_when_serving)
            state["serving"] = True

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as error:  # noqa: BLE001 — reported to the test
            failure.append(error)

    thread = threading.Thread(target=run, name="hypercorn-trio", daemon=True)
    thread.start()
    try:
        try:
            _wait_for(lambda: state.get("serving", False), thread, "hypercorn (trio)")
        except RuntimeError:
            if failure:
                raise RuntimeError(f"hypercorn (trio) failed: {failure[0]!r}") from failure[0]
            raise
        yield f"http://127.0.0.1:{port}"
    finally:
        if "token" in state and thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(state["stop"].set, trio_token=state["token"])
        thread.join(STOP_DEADLINE_S)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"hypercorn (trio) did not stop within {STOP_DEADLINE_S:.0f} s")


# ---------------------------------------------------------------------------
# The client


@dataclass
class Outcome:
    sent_id: object
    sentinel: str
    verdict: str  # OK, REFUSED, SWAPPED, WRONG_ID, TIMEOUT, ERROR
    status: Optional[int] = None
    message: Optional[dict] = None
    detail: str = ""


def client(connections: int = CALLS + 4) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(trust_env=False, timeout=CALL_DEADLINE_S, limits=limits)


async def open_session(http: httpx.AsyncClient, url: str) -> str:
    """`initialize` and `notifications/initialized` (packaging/burst.py's); the session id."""
    return await asyncio.wait_for(_open_session(http, url), timeout=CALL_DEADLINE_S)


def tool_call(rpc_id: object, tool: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


async def call_tool(
    http: httpx.AsyncClient,
    url: str,
    session: str,
    rpc_id: object,
    tool: str = "echo",
    extra: Optional[dict] = None,
    deadline: float = CALL_DEADLINE_S,
    prefix: str = "ECHO",
) -> Outcome:
    """One `tools/call` of `echo` (or `slow_echo`) with a fresh sentinel; what came back."""
    sentinel = uuid.uuid4().hex
    body = tool_call(rpc_id, tool, {"sentinel": sentinel, **(extra or {})})
    try:
        response = await asyncio.wait_for(
            http.post(url, headers={**HEADERS, "mcp-session-id": session}, json=body), timeout=deadline
        )
    except (asyncio.TimeoutError, httpx.TimeoutException):
        return Outcome(rpc_id, sentinel, "TIMEOUT")
    except httpx.HTTPError as error:
        return Outcome(rpc_id, sentinel, "ERROR", detail=f"{type(error).__name__}: {error}")
    message = read_response(response.text)
    status = response.status_code
    if message is None:
        return Outcome(rpc_id, sentinel, "ERROR", status, None, f"HTTP {status}: {response.text[:200]!r}")
    if not same_id(rpc_id, message.get("id")):
        return Outcome(rpc_id, sentinel, "WRONG_ID", status, message, f"id {message.get('id')!r}")
    if "error" in message:
        return Outcome(rpc_id, sentinel, "REFUSED", status, message, f"HTTP {status}: {message['error']}")
    try:
        text = message["result"]["content"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return Outcome(rpc_id, sentinel, "ERROR", status, message, f"no text content: {json.dumps(message)[:200]}")
    if text != f"{prefix}:{sentinel}":
        return Outcome(rpc_id, sentinel, "SWAPPED", status, message, f"got {text!r}")
    return Outcome(rpc_id, sentinel, "OK", status, message)


async def burst(base: str, ids: List[object], deadline: float = CALL_DEADLINE_S) -> List[Outcome]:
    """Concurrent `echo` calls with the given ids, all in one new session."""
    url = f"{base}/mcp"
    async with client(len(ids) + 4) as http:
        session = await open_session(http, url)
        return list(await asyncio.gather(*(call_tool(http, url, session, i, deadline=deadline) for i in ids)))


def tally(outcomes: List[Outcome]) -> str:
    counts: Dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.verdict] = counts.get(outcome.verdict, 0) + 1
    order = ["OK", "REFUSED", "SWAPPED", "WRONG_ID", "TIMEOUT", "ERROR"]
    return " ".join(f"{verdict}={counts.get(verdict, 0)}" for verdict in order)


def explain(outcomes: List[Outcome]) -> str:
    lines = [tally(outcomes)]
    lines += [f"  id {o.sent_id!r} {o.sentinel[:8]}: {o.verdict} {o.detail}" for o in outcomes if o.verdict != "OK"]
    return "\n".join(lines)


async def wait_until(condition: Callable[[], bool], what: str, deadline: float = CALL_DEADLINE_S) -> None:
    """Until the condition holds (checked every 10 ms), at most `deadline` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        await asyncio.sleep(0.01)


async def wait_in_flight(guard: Any, count: int) -> None:
    """Until the guard has `count` requests in flight."""
    await wait_until(lambda: guard.stats()["in_flight_requests"] >= count, f"{count} in flight")


def tool_calls_seen(recorder: Recorder) -> int:
    """How many `tools/call` requests the app behind the guard has received whole."""
    return sum(1 for seen in recorder.seen if b'"tools/call"' in seen.body)


# ---------------------------------------------------------------------------
# The app under test, guarded or bare


@dataclass
class Served:
    base: str
    url: str
    recorder: Recorder
    guard: Any  # the IdGuard, or None for the bare app


@contextlib.contextmanager
def serve(
    *,
    guarded: bool,
    json_response: bool = False,
    server: str = "uvicorn",
    **guard_options: Any,
) -> Iterator[Served]:
    """A fresh FastMCP app (recorded), wrapped in IdGuard(**guard_options) or bare, served on loopback."""
    from mcp_app import make_mcp_app

    recorder = Recorder(make_mcp_app(json_response=json_response))
    guard = None
    app: ASGIApp = recorder
    if guarded:
        from mcp_id_guard import IdGuard

        guard = IdGuard(recorder, **guard_options)
        app = guard
    run = {"uvicorn": uvicorn_server, "hypercorn-trio": hypercorn_trio_server}[server]
    with run(app) as base:
        yield Served(base, f"{base}/mcp", recorder, guard)
