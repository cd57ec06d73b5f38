"""A stateful FastMCP streamable-HTTP server whose slow tool closes its stream for polling.

SEP-1699 polling (protocol 2025-11-25, python-sdk 1.27.0): with an event store,
the server opens each POST's SSE stream with a priming event (an event id and
no data). The `slow_echo` tool then calls `ctx.close_sse_stream()`, which ends
the POST's HTTP response while the tool goes on running; its answer is kept in
the event store and reaches the client when it resumes with `GET` and
`Last-Event-ID`. The server files every event under the JSON-RPC id of the
request it belongs to, so a second request with the same id, sent while the
first still runs, shares its event stream: see polling.py.

Tools:
  slow_echo(sentinel)  closes its stream, answers `SLOW:<sentinel>` after
                       SLOW_ECHO_DELAY_S seconds
  echo(sentinel)       answers `ECHO:<sentinel>` at once

Like fastmcp_echo_server.py it listens on a free loopback port chosen by the
kernel and announces it as the first line on stdout, `LISTENING <port>`.
"""

import os
import socket
import sys
import uuid
import warnings
from collections import deque
from dataclasses import dataclass

# pydantic-settings releases newer than mcp 1.27.0 warn about a field of the
# SDK's settings model at import time; it changes nothing here.
warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from mcp.server.fastmcp import Context, FastMCP  # noqa: E402
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId  # noqa: E402
from mcp.types import JSONRPCMessage  # noqa: E402

# Long enough that a second call made while the stream is closed is answered
# first on any machine; the client's deadlines leave room for it.
SLOW_ECHO_DELAY_S = 1.0
# Suggested reconnection delay (the SSE `retry` field of the priming event).
RETRY_INTERVAL_MS = 100


@dataclass
class Event:
    event_id: EventId
    stream_id: StreamId
    message: JSONRPCMessage | None


class InMemoryEventStore(EventStore):
    """The SDK's example event store (mcp ships only the interface), in short.

    Replay sends the events of the stream the given event belongs to that
    came after it, priming events (no message) left out.
    """

    def __init__(self, max_events_per_stream: int = 100) -> None:
        self.max_events_per_stream = max_events_per_stream
        self.streams: dict[StreamId, deque[Event]] = {}
        self.events: dict[EventId, Event] = {}

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event = Event(uuid.uuid4().hex, stream_id, message)
        stream = self.streams.setdefault(stream_id, deque())
        if len(stream) == self.max_events_per_stream:
            del self.events[stream.popleft().event_id]
        stream.append(event)
        self.events[event.event_id] = event
        return event.event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        last = self.events.get(last_event_id)
        if last is None:
            return None
        after = False
        for event in list(self.streams.get(last.stream_id, ())):
            if after and event.message is not None:
                await send_callback(EventMessage(event.message, event.event_id))
            after = after or event.event_id == last_event_id
        return last.stream_id


# host="127.0.0.1" also switches on the SDK's DNS-rebinding protection, as in
# fastmcp_echo_server.py.
mcp = FastMCP(
    name="polling",
    host="127.0.0.1",
    stateless_http=False,
    log_level="WARNING",
    event_store=InMemoryEventStore(),
    retry_interval=RETRY_INTERVAL_MS,
)


@mcp.tool()
async def slow_echo(sentinel: str, ctx: Context) -> str:
    """Close this request's stream (the client polls), then answer after a delay."""
    await ctx.close_sse_stream()
    await anyio.sleep(SLOW_ECHO_DELAY_S)
    return f"SLOW:{sentinel}"


@mcp.tool()
async def echo(sentinel: str) -> str:
    """Answer with the sentinel at once."""
    return f"ECHO:{sentinel}"


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = mcp.streamable_http_app()
    if os.environ.get("MCP_ID_GUARD_IN_PROCESS") == "1":
        # The guard in process (polling.py --in-process): the wheel's ASGI middleware.
        from mcp_id_guard import IdGuard

        app = IdGuard(app)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    print(f"LISTENING {port}", flush=True)
    server.run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
