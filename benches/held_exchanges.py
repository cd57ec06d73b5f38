#!/usr/bin/env python3
"""Memory per held exchange through one front (issue 22), driven by
benches/held_vs_nginx.sh.

The script is both ends around the front: a stand-in MCP upstream on
UPSTREAM_PORT that answers `initialize` at once and then holds every
`tools/call`, and N clients, each on its own connection, that open their own
session through the front and send one small tracked `tools/call` with a
unique id. The upstream holds it in one of two shapes:

  pending   it never answers (a tool call still running);
  sse       it answers 200 `text/event-stream` with one event (a progress
            notification) and then stays quiet (a call that streams).

Once every call is held (the upstream has all N, and in the `sse` shape every
client has read its event), the front's resident set is read from
/proc/PID/status (VmRSS) and compared with the reading taken after the
sessions were opened and before the calls were sent, so the sessions' own
cost is not counted, only the held exchanges'. Prints one JSON line.

    held_exchanges.py --front-port P --upstream-port Q --pid PID --shape pending -n 2000
"""

import argparse
import asyncio
import json
import sys

INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":'
    b'"2025-06-18","capabilities":{},"clientInfo":{"name":"held","version":"0"}}}'
)


def call_body(n):
    return (
        '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo",'
        '"arguments":{"message":"held %d"}}}' % (n, n)
    ).encode()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


async def read_body(reader, headers):
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return body
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    return b""


class Upstream:
    """The stand-in MCP server: answers initialize, holds tools/call."""

    def __init__(self, shape, count):
        self.shape = shape
        self.count = count
        self.sessions = 0
        self.held = 0
        self.all_held = asyncio.Event()
        self.writers = []

    async def serve(self, reader, writer):
        self.writers.append(writer)
        try:
            while True:
                _, headers = await read_head(reader)
                body = await read_body(reader, headers)
                if b'"initialize"' in body:
                    self.sessions += 1
                    answer = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"held","version":"0"}}}'
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Mcp-Session-Id: held-%d\r\nContent-Length: %d\r\n\r\n%s"
                        % (self.sessions, len(answer), answer)
                    )
                    await writer.drain()
                    continue
                if self.shape == "sse":
                    event = (
                        b'event: message\ndata: {"jsonrpc":"2.0","method":'
                        b'"notifications/progress","params":{"progressToken":1,'
                        b'"progress":1}}\n\n'
                    )
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + b"%x\r\n%s\r\n" % (len(event), event)
                    )
                    await writer.drain()
                self.held += 1
                if self.held == self.count:
                    self.all_held.set()
                # Held: nothing more is read or written until the end.
                await reader.read()
                return
        except (asyncio.IncompleteReadError, asyncio.CancelledError, ConnectionError):
            return


async def open_session(port):
    """One connection, with its own session opened through the front."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
        % (port, len(INIT), INIT)
    )
    await writer.drain()
    status, headers = await read_head(reader)
    await read_body(reader, headers)
    if " 200" not in status or "mcp-session-id" not in headers:
        raise RuntimeError(f"initialize: {status}")
    return reader, writer, headers["mcp-session-id"].encode()


async def call(port, n, connection, shape):
    """Sends one tools/call; in the `sse` shape, waits for its one event."""
    reader, writer, session = connection
    body = call_body(n)
    writer.write(
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\n"
        b"Mcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (port, session, len(body), body)
    )
    await writer.drain()
    if shape == "sse":
        status, _ = await read_head(reader)
        if " 200" not in status:
            raise RuntimeError(f"tools/call: {status}")
        # The chunk size line, then the event up to its blank line.
        await reader.readline()
        await reader.readuntil(b"\n\n")


async def measure(args):
    upstream = Upstream(args.shape, args.n)
    server = await asyncio.start_server(
        upstream.serve, "127.0.0.1", args.upstream_port, backlog=4096
    )
    start_rss = rss_kib(args.pid)
    # Sessions open in waves, so neither front's accept queue overflows.
    connections = []
    for start in range(0, args.n, 200):
        wave = min(200, args.n - start)
        connections += await asyncio.wait_for(
            asyncio.gather(*(open_session(args.front_port) for _ in range(wave))), 60
        )
    await asyncio.sleep(args.settle)
    before = rss_kib(args.pid)
    if args.sessions_only:
        print(json.dumps({"sessions": args.n, "rss_start_kib": start_rss, "rss_sessions_kib": before,
                          "kib_per_session_and_connection": round((before - start_rss) / args.n, 2)}))
        await asyncio.sleep(args.hold_for)
        return
    calls = [
        asyncio.create_task(call(args.front_port, n + 1, connection, args.shape))
        for n, connection in enumerate(connections)
    ]
    await asyncio.wait_for(upstream.all_held.wait(), 120)
    await asyncio.wait_for(asyncio.gather(*calls), 120)
    await asyncio.sleep(args.settle)
    held = rss_kib(args.pid)
    if args.hold_for:
        print(f"holding {args.n} exchanges for {args.hold_for} s", file=sys.stderr)
        await asyncio.sleep(args.hold_for)
    for writer in upstream.writers:
        writer.close()
    for _, writer, _ in connections:
        writer.close()
    server.close()
    await server.wait_closed()
    print(
        json.dumps(
            {
                "shape": args.shape,
                "exchanges": args.n,
                "rss_start_kib": start_rss,
                "rss_before_kib": before,
                "rss_held_kib": held,
                # The held exchange alone (its connections and session were
                # already open), and all of it (connections, session, call).
                "kib_per_exchange": round((held - before) / args.n, 2),
                "kib_per_exchange_and_connections": round((held - start_rss) / args.n, 2),
            }
        )
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--front-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="the process to read VmRSS of")
    parser.add_argument("--shape", choices=["pending", "sse"], required=True)
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--hold-for", type=float, default=0.0, help="keep holding (for a profiler)")
    parser.add_argument("--sessions-only", action="store_true", help="open the sessions, send no call")
    args = parser.parse_args()
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
