#!/usr/bin/env python3
"""Prints the tables of BENCHMARKS.md from criterion's saved estimates.

The paired session comparison (`sessions/paired/...`) is printed by the
bench itself, not saved by criterion.

    cargo bench --bench guard
    python3 benches/summarize.py [CRITERION_DIR]

CRITERION_DIR defaults to $CRITERION_HOME, else <cargo target dir>/criterion.
Each time is criterion's typical estimate (the slope of the linear fit, the
mean under flat sampling), the same number as the middle one criterion prints.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

SIZES = ["256B", "1KiB", "64KiB", "1MiB"]
CASES = ["untracked", "pass_through", "remapped", "rejected"]


def criterion_dir():
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    if os.environ.get("CRITERION_HOME"):
        return Path(os.environ["CRITERION_HOME"])
    metadata = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(json.loads(metadata.stdout)["target_directory"]) / "criterion"


def load(root):
    """{(group, function, value): (seconds, low, high, throughput bytes or None)}"""
    results = {}
    for bench in root.glob("**/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        estimates = json.loads((bench.parent / "estimates.json").read_text())
        typical = estimates.get("slope") or estimates["mean"]
        interval = typical["confidence_interval"]
        throughput = (meta.get("throughput") or {}).get("Bytes")
        key = (meta["group_id"], meta["function_id"], meta["value_str"])
        results[key] = (
            typical["point_estimate"] * 1e-9,
            interval["lower_bound"] * 1e-9,
            interval["upper_bound"] * 1e-9,
            throughput,
        )
    return results


def duration(seconds):
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def rate(bytes_per_run, seconds):
    gib = bytes_per_run / seconds / 2**30
    return f"{gib:.2f} GiB/s" if gib >= 1 else f"{gib * 1024:.0f} MiB/s"


def main():
    root = criterion_dir()
    results = load(root)
    if not results:
        sys.exit(f"no criterion results under {root}")

    def get(group, function, value):
        return results.get((group, function, value))

    print("### 1. Layer overhead (per request, in-process)\n")
    print("| case | body | bare | guarded | guarded − bare | added, paired (95% CI) |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in CASES:
        for size in SIZES:
            bare = get(f"overhead/{case}", "bare", size)
            guarded = get(f"overhead/{case}", "guarded", size)
            added = get(f"overhead/{case}", "added", size)
            if not (bare and guarded):
                continue
            paired = (
                f"**{duration(added[0])}** ({duration(added[1])} – {duration(added[2])})"
                if added
                else "–"
            )
            print(
                f"| {case.replace('_', '-')} | {size} | {duration(bare[0])} | "
                f"{duration(guarded[0])} | {duration(guarded[0] - bare[0])} | {paired} |"
            )

    print("\n### 2. Naive `Value` round trip vs splice (request remap + response restore)\n")
    print("| body | naive | splice | speed-up |")
    print("|---:|---:|---:|---:|")
    for size in SIZES:
        naive = get("naive_vs_splice", "naive", size)
        splice = get("naive_vs_splice", "splice", size)
        if not (naive and splice):
            continue
        print(
            f"| {size} | {duration(naive[0])} | {duration(splice[0])} | "
            f"**{naive[0] / splice[0]:.1f}×** |"
        )

    print("\n### 3. SSE rewrite throughput (8 KiB chunks, ≥ 1 MiB per stream)\n")
    print("| event size | memchr2 scan (ceiling) | no restorable id | every event restored |")
    print("|---:|---:|---:|---:|")
    for size in ["1KiB", "64KiB", "1MiB"]:
        cells = []
        for function in ["memchr_ceiling", "no_id", "restore"]:
            result = get("sse", function, size)
            cells.append(rate(result[3], result[0]) if result and result[3] else "–")
        print(f"| {size} | " + " | ".join(cells) + " |")

    print("\n### 4. Session scaling (tracked pass-through, 1 KiB)\n")
    print("| sessions with a request in flight | time per request | vs 1 session |")
    print("|---:|---:|---:|")
    one = get("sessions", "pass_through_1KiB", "1")
    for count in ["1", "100", "10000"]:
        result = get("sessions", "pass_through_1KiB", count)
        if not result:
            continue
        versus = f"{(result[0] / one[0] - 1) * 100:+.1f} %" if one else "–"
        print(f"| {int(count):,} | {duration(result[0])} | {versus} |")


if __name__ == "__main__":
    main()
