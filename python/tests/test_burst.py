"""The reported bug: 12 concurrent `tools/call`, all `id: 1`, in one session.

With IdGuard every call gets its own answer with its own id; the bare app is
the control, which must go wrong (answers swapped, or hung until the
wall-clock deadline), or the test proves nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from harness import CALLS, burst, explain, serve, tally

MODES = [pytest.param(False, id="sse"), pytest.param(True, id="json")]


@pytest.mark.parametrize("json_response", MODES)
def test_burst_guarded_every_call_gets_its_own_answer(json_response: bool) -> None:
    with serve(guarded=True, json_response=json_response) as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS))
        stats = served.guard.stats()
    mode = "json" if json_response else "sse"
    print(f"guarded ({mode}): {tally(outcomes)}; remapped_total={stats['remapped_total']}")
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)
    assert stats["remapped_total"] >= 1, stats
    assert stats["in_flight_requests"] == 0, stats


@pytest.mark.parametrize("json_response", MODES)
def test_burst_guarded_number_and_string_ids(json_response: bool) -> None:
    # The Python SDK routes by str(id): 1 and "1" are one slot to it.
    with serve(guarded=True, json_response=json_response) as served:
        outcomes = asyncio.run(burst(served.base, [1, "1"] * (CALLS // 2)))
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)


@pytest.mark.control
@pytest.mark.parametrize("json_response", MODES)
def test_burst_bare_control_goes_wrong(json_response: bool) -> None:
    with serve(guarded=False, json_response=json_response) as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS))
    print(f"bare control ({'json' if json_response else 'sse'}): {tally(outcomes)}")
    assert any(o.verdict != "OK" for o in outcomes), "the bare app answered all 12: the control shows nothing"


@pytest.mark.parametrize("json_response", MODES)
def test_burst_bare_unique_ids_work(json_response: bool) -> None:
    # The server itself works: with unique ids the bare app answers all.
    with serve(guarded=False, json_response=json_response) as served:
        outcomes = asyncio.run(burst(served.base, list(range(100, 100 + CALLS))))
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)
