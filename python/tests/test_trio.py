"""The burst under hypercorn's trio worker: IdGuard awaits with anyio, so trio servers work too."""

from __future__ import annotations

import asyncio

import pytest

from harness import CALLS, burst, explain, serve, tally


def test_burst_guarded_under_hypercorn_trio() -> None:
    with serve(guarded=True, server="hypercorn-trio") as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS))
        stats = served.guard.stats()
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)
    assert stats["remapped_total"] >= 1, stats


def test_queue_under_hypercorn_trio() -> None:
    with serve(guarded=True, server="hypercorn-trio", on_duplicate="queue") as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS, deadline=35.0))
    assert all(o.verdict == "OK" for o in outcomes), explain(outcomes)


@pytest.mark.control
def test_burst_bare_under_hypercorn_trio_control_goes_wrong() -> None:
    with serve(guarded=False, server="hypercorn-trio") as served:
        outcomes = asyncio.run(burst(served.base, [1] * CALLS))
    print(f"bare control (hypercorn-trio): {tally(outcomes)}")
    assert any(o.verdict != "OK" for o in outcomes), "the bare app answered all 12: the control shows nothing"
