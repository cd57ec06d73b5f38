"""The other policies: a duplicate is refused (`reject`) or waits its turn (`queue`)."""

from __future__ import annotations

import asyncio

import pytest

from harness import CALLS, burst, call_tool, client, explain, open_session, serve, tally, wait_in_flight, wait_until

# Under `queue` the 12 calls run one after another (up to 0.5 s each).
QUEUE_DEADLINE_S = 30.0


def test_reject_every_duplicate_gets_a_clean_error_and_none_hangs() -> None:
    with serve(guarded=True, on_duplicate="reject") as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS))
        stats = served.guard.stats()
    refused = [o for o in outcomes if o.verdict == "REFUSED"]
    print(f"reject: {tally(outcomes)}; rejected_total={stats['rejected_total']}")
    assert all(o.verdict in ("OK", "REFUSED") for o in outcomes), explain(outcomes)
    assert refused, f"no duplicate was refused: {explain(outcomes)}"
    assert any(o.verdict == "OK" for o in outcomes), explain(outcomes)
    for outcome in refused:
        # The tower layer's answer: 400 + a JSON-RPC error -32600 with the request's own id.
        assert outcome.status == 400, explain([outcome])
        assert outcome.message["jsonrpc"] == "2.0"
        assert outcome.message["error"]["code"] == -32600, outcome.message
    assert stats["rejected_total"] == len(refused), stats
    assert stats["in_flight_requests"] == 0, stats


def test_queue_every_duplicate_gets_its_own_answer_in_turn() -> None:
    with serve(guarded=True, on_duplicate="queue", max_queue_wait=QUEUE_DEADLINE_S) as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS, deadline=QUEUE_DEADLINE_S + 5))
        stats = served.guard.stats()
    print(f"queue: {tally(outcomes)}; queued_total={stats['queued_total']}")
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)
    assert stats["queued_total"] >= 1, stats
    assert stats["in_flight_requests"] == 0, stats


def test_queue_wait_past_max_queue_wait_is_answered_503() -> None:
    # The first call holds id 1 for 3 s; the second may wait 0.5 s.
    async def scenario(url: str) -> tuple:
        async with client() as http:
            session = await open_session(http, url)
            first = asyncio.ensure_future(
                call_tool(http, url, session, 1, tool="slow_echo", extra={"seconds": 3.0}, prefix="SLOW")
            )
            await wait_in_flight(served.guard, 1)
            second = await call_tool(http, url, session, 1)
            return await first, second

    with serve(guarded=True, on_duplicate="queue", max_queue_wait=0.5) as served:
        first, second = asyncio.run(scenario(served.url))
    assert first.verdict == "OK", explain([first])
    assert second.verdict == "REFUSED" and second.status == 503, explain([second])
    assert second.message["error"]["code"] == -32000, second.message


def test_queue_client_leaving_while_queued_is_never_forwarded() -> None:
    # A holds id 1 for 1.5 s; B queues behind it and its client gives up; C
    # queues too. The app gets A and C, never B, and C gets its own answer.
    async def scenario(url: str) -> tuple:
        async with client() as http:
            session = await open_session(http, url)
            first = asyncio.ensure_future(
                call_tool(http, url, session, 1, tool="slow_echo", extra={"seconds": 1.5}, prefix="SLOW")
            )
            await wait_in_flight(served.guard, 1)
            leaving = asyncio.ensure_future(call_tool(http, url, session, 1))
            await wait_until(lambda: served.guard.stats()["queued_total"] >= 1, "the second call queued")
            leaving.cancel()  # the client gives up: httpx drops the connection
            with pytest.raises(asyncio.CancelledError):
                await leaving
            third = await call_tool(http, url, session, 1)
            return await first, third

    with serve(guarded=True, on_duplicate="queue") as served:
        first, third = asyncio.run(scenario(served.url))
        bodies = [seen.body for seen in served.recorder.seen if b'"tools/call"' in seen.body]
        stats = served.guard.stats()
    assert first.verdict == "OK" and third.verdict == "OK", explain([first, third])
    assert len(bodies) == 2 and first.sentinel.encode() in bodies[0] and third.sentinel.encode() in bodies[1]
    assert stats["in_flight_requests"] == 0, stats
