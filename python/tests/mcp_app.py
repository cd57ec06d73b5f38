"""The FastMCP server under test (mcp 1.27.0, the release the cross-wiring was reported against).

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
from mcp.server.fastmcp import FastMCP  # noqa: E402


def make_mcp_app(*, json_response: bool) -> Any:
    """`streamable_http_app()` of a stateful FastMCP server with the test's tools.

    host="127.0.0.1" switches on the SDK's DNS-rebinding protection (Host must
    be a loopback name), as a real local deployment has it.
    """
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

    return mcp.streamable_http_app()
