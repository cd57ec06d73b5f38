"""The FastMCP server of the Python-face benchmark (benches/python/faces.py).

    server.py --face bare|inproc [--json]

A stateful FastMCP (mcp 1.27.0) streamable-HTTP server under uvicorn on a
kernel-chosen loopback port, announced as `LISTENING <port>` on stdout;
`--face inproc` wraps the SDK's app in `mcp_id_guard.IdGuard`. Two tools:
`echo(sentinel)` answers at once (throughput, latency), `hold()` never
answers (memory per held exchange).
"""

from __future__ import annotations

import argparse
import socket
import warnings

warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from mcp.server.fastmcp import FastMCP  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--face", choices=("bare", "inproc"), required=True)
    parser.add_argument("--json", action="store_true", help="JSON responses instead of SSE")
    args = parser.parse_args()

    mcp = FastMCP(
        name="bench", host="127.0.0.1", stateless_http=False, json_response=args.json, log_level="WARNING"
    )

    @mcp.tool()
    async def echo(sentinel: str) -> str:
        """Answers at once."""
        return f"ECHO:{sentinel}"

    @mcp.tool()
    async def hold() -> str:
        """Never answers: an exchange held open."""
        await anyio.sleep_forever()
        return ""

    app = mcp.streamable_http_app()
    if args.face == "inproc":
        from mcp_id_guard import IdGuard

        app = IdGuard(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", backlog=2048, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
