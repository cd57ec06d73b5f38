"""jlowin's FastMCP (the `fastmcp` package, 4.x over mcp 2.x): IdGuard goes in as
Starlette middleware, `http_app(middleware=[Middleware(IdGuard)])`, and keeps a
burst of 12 `id: 1` calls apart; the bare app is the control.

Runs where `fastmcp` is installed (the mcp 2.3.0 environment of
packaging/test-packages.sh); FastMCP 4 needs mcp 2, so the mcp 1.27.0
environment skips it, and says so.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from harness import CALLS, burst, explain, tally, uvicorn_server

fastmcp = pytest.importorskip("fastmcp", reason="jlowin's FastMCP 4 needs mcp 2: tested in the mcp 2.3.0 environment")

MODES = [pytest.param(False, id="sse"), pytest.param(True, id="json")]


def make_app(*, guarded: bool, json_response: bool):  # noqa: ANN201
    import anyio
    from starlette.middleware import Middleware

    from mcp_id_guard import IdGuard

    mcp = fastmcp.FastMCP("echo")

    @mcp.tool
    async def echo(sentinel: str) -> str:
        """Answer with the sentinel after a random delay (0-0.5 s), so calls overlap."""
        await anyio.sleep(random.uniform(0.0, 0.5))
        return f"ECHO:{sentinel}"

    middleware = [Middleware(IdGuard)] if guarded else []
    return mcp.http_app(middleware=middleware, json_response=json_response, stateless_http=False)


@pytest.mark.parametrize("json_response", MODES)
def test_fastmcp_http_app_with_idguard_keeps_answers_apart(json_response: bool) -> None:
    with uvicorn_server(make_app(guarded=True, json_response=json_response)) as base:
        outcomes = asyncio.run(burst(base, [1] * CALLS))
    print(f"fastmcp guarded ({'json' if json_response else 'sse'}): {tally(outcomes)}")
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)


@pytest.mark.control
@pytest.mark.parametrize("json_response", MODES)
def test_fastmcp_bare_control_goes_wrong(json_response: bool) -> None:
    with uvicorn_server(make_app(guarded=False, json_response=json_response)) as base:
        outcomes = asyncio.run(burst(base, [1] * CALLS))
    print(f"fastmcp bare control ({'json' if json_response else 'sse'}): {tally(outcomes)}")
    assert any(o.verdict != "OK" for o in outcomes), "the bare app answered all 12: the control shows nothing"
