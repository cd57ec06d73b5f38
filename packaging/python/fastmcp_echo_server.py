"""A stateful FastMCP streamable-HTTP server with one slow echo tool.

This is the server of the Python SDK's bug report (python-sdk 1.27.0): in one
session, concurrent `tools/call` POSTs that share a JSON-RPC id cross-wire.
It listens on a free loopback port chosen by the kernel and announces it as
the first line on stdout, `LISTENING <port>`, so the test never races another
process for a port number.
"""

import random
import socket
import sys
import warnings

# pydantic-settings releases newer than mcp 1.27.0 warn about a field of the
# SDK's settings model at import time; it changes nothing here.
warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from mcp.server.fastmcp import FastMCP  # noqa: E402

# host="127.0.0.1" also switches on the SDK's DNS-rebinding protection (Host
# must be a loopback name), as a real local deployment has it: the proxy must
# get through it.
mcp = FastMCP(name="echo", host="127.0.0.1", stateless_http=False, log_level="WARNING")


@mcp.tool()
async def echo(sentinel: str) -> str:
    """Answer with the sentinel after a random delay, so calls overlap."""
    await anyio.sleep(random.uniform(0.0, 0.5))
    return f"ECHO:{sentinel}"


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before the announcement: a client that connects at once
    # waits in the backlog until uvicorn accepts, it is never refused.
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(mcp.streamable_http_app(), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    print(f"LISTENING {port}", flush=True)
    server.run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
