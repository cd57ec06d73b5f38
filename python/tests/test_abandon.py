"""A client that gives up on a call, then reuses its id while the server still runs the first.

The first call (`slow_echo`, 1 s) is cancelled by its client once the app has
it: the HTTP request is dropped, but the server goes on running the tool and
answers it under the client's id. The reuse of that id (`slow_echo`, 2 s) is
still in flight when that late answer comes. Bare, the SDK hands the late
answer to the reuse; with IdGuard the id was left abandoned, the reuse went
with a server-side id, and it gets its own answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness import Outcome, call_tool, client, explain, open_session, serve, tally, tool_calls_seen, wait_until

FIRST_S = 1.0
REUSE_S = 2.0


async def give_up_then_reuse(url: str, recorder: Any) -> Outcome:
    async with client() as http:
        session = await open_session(http, url)
        first = asyncio.ensure_future(
            call_tool(http, url, session, 1, tool="slow_echo", extra={"seconds": FIRST_S}, prefix="SLOW")
        )
        await wait_until(lambda: tool_calls_seen(recorder) >= 1, "the app has the first call")
        first.cancel()  # the client gives up: httpx drops the connection
        with pytest.raises(asyncio.CancelledError):
            await first
        return await call_tool(http, url, session, 1, tool="slow_echo", extra={"seconds": REUSE_S}, prefix="SLOW")


@pytest.mark.parametrize("json_response", [pytest.param(False, id="sse"), pytest.param(True, id="json")])
def test_reuse_after_abandon_gets_its_own_answer(json_response: bool) -> None:
    with serve(guarded=True, json_response=json_response) as served:
        reuse = asyncio.run(give_up_then_reuse(served.url, served.recorder))
        stats = served.guard.stats()
    assert reuse.verdict == "OK", explain([reuse])
    assert stats["remapped_total"] >= 1, stats


@pytest.mark.control
def test_reuse_after_abandon_bare_control_goes_wrong() -> None:
    with serve(guarded=False) as served:
        reuse = asyncio.run(give_up_then_reuse(served.url, served.recorder))
    print(f"bare control (reuse after abandon): {tally([reuse])}")
    assert reuse.verdict != "OK", "the bare app answered the reuse right: the control shows nothing"
