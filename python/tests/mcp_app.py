"""The MCP server under test: FastMCP of mcp 1.27.0 (the release the cross-wiring was reported
against), or MCPServer of mcp 2.3.0, the newest release, which still cross-wires.

A fresh server per test: its session manager runs once per instance.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

# pydantic-settings releases newer than mcp 1.27.0 warn about a field of the
# SDK's settings model at import time; it changes nothing here.
warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")

import anyio  # noqa: E402

try:  # python-sdk 2.x: FastMCP was renamed MCPServer
    from mcp.server.mcpserver import MCPServer
except ImportError:  # python-sdk 1.x
    MCPServer = None
    from mcp.server.fastmcp import FastMCP


def make_mcp_app(*, json_response: bool) -> Any:
    """`streamable_http_app()` of a stateful MCP server with the test's tools.

    python-sdk 1.x: FastMCP; 2.x: MCPServer, whose transport options moved
    to `streamable_http_app`. host="127.0.0.1" switches on the SDK's
    DNS-rebinding protection (Host must be a loopback name), as a real local
    deployment has it.
    """
    if MCPServer is not None:
        mcp = MCPServer(name="echo", log_level="WARNING")
    else:
        mcp = FastMCP(
            name="echo",
            host="127.0.0.1",
            stateless_http=False,
            json_response=json_response,
            log_level="WARNING",
        )

    @mcp.tool()
    async def echo(sentinel: str) -> str:
        """Answer with the sentinel after a random delay (0-0.5 s), so calls overlap."""
        await anyio.sleep(random.uniform(0.0, 0.5))
        return f"ECHO:{sentinel}"

    @mcp.tool()
    async def slow_echo(sentinel: str, seconds: float) -> str:
        """Answer with the sentinel after the given delay."""
        await anyio.sleep(seconds)
        return f"SLOW:{sentinel}"

    if MCPServer is not None:
        return mcp.streamable_http_app(json_response=json_response, stateless_http=False, host="127.0.0.1")
    return mcp.streamable_http_app()
