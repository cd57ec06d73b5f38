"""Runs the installed `mcp-id-guard probe` against a real MCP server, alone and behind the installed proxy.

Usage: probe.py --guard COMMAND [--label NAME] [--readme README.md] -- SERVER COMMAND...

The server command is started as burst.py starts it (it prints `LISTENING
<port>`). Alone, the server must be found cross-wiring (exit 1, a `bug`
verdict on same-id or number-vs-string); behind `COMMAND --upstream` the
probe must find nothing (exit 0). With --readme, the probe also runs as the
README's sample shows it (text output, default flags), and each run's output
must be the README's sample of it ("Is my server affected?"), up to what
varies from run to run: the ports, how many requests of a wave that hung
failed and how, and which request of a pair got which answer. Every run is
bounded; both processes are stopped on every way out. Exits 0 when all
hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import signal
import subprocess
import sys

from burst import start_guard, start_server, stop

# Two pair checks whose hung requests cost the probe's --timeout per wave,
# plus the sessions around them; far below this.
PROBE_DEADLINE_S = 120


def probe(command: str, url: str) -> tuple[int, dict]:
    done = subprocess.run(
        [command, "probe", url, "--json", "--timeout", "3s"],
        capture_output=True, text=True, timeout=PROBE_DEADLINE_S,
    )
    report = json.loads(done.stdout)
    for check in report["checks"]:
        print(f"    {check['name']:<20} {check['verdict']:<10} {check['summary']}", flush=True)
    return done.returncode, report


def probe_text(command: str, url: str) -> list[str]:
    """The probe's text report, as the README runs it (no flags)."""
    done = subprocess.run(
        [command, "probe", url], capture_output=True, text=True, timeout=PROBE_DEADLINE_S,
    )
    return done.stdout.splitlines()


def readme_samples(readme: str) -> list[list[str]]:
    """The output lines of each `$ mcp-id-guard probe` command in the README's console block."""
    with open(readme, encoding="utf-8") as file:
        text = file.read()
    block = text.split("```console\n$ mcp-id-guard probe ", 1)[1].split("```", 1)[0]
    samples: list[list[str]] = []
    for line in ("$ mcp-id-guard probe " + block).splitlines():
        if line.startswith("$ "):
            samples.append([])
        elif line:
            samples[-1].append(line)
    return samples


# A problem line: which request of a pair got which answer is a race.
PAIR_LINE = re.compile(r"^(\s*- pair \d+: \S+ id \S+): .*$")


def normalised(lines: list[str], port: int) -> list[str]:
    """What of the probe's text is the same in every run: ports written as
    `port`, counts of a failing check as N, a pair's problem lines without
    their outcome."""
    out = []
    for line in lines:
        line = re.sub(r"(127\.0\.0\.1|evil\.example):\d+", rf"\1:{port}", line)
        line = PAIR_LINE.sub(r"\1", line)
        if "failed; answers:" in line:
            head, tail = line.split(" failed; answers:", 1)
            head = re.sub(r"\d+$", "N", head)
            line = head + " failed; answers:" + re.sub(r"\d+", "N", tail)
        out.append(line)
    return out


def sample_matches(name: str, sample: list[str], output: list[str], port: int) -> bool:
    expected, got = normalised(sample, port), normalised(output, port)
    if expected == got:
        return True
    print(f"  README.md's probe sample ({name}) is not what the probe printed:", flush=True)
    for line in difflib.unified_diff(expected, got, "README.md", "probe", lineterm=""):
        print(f"    {line}", flush=True)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guard", required=True, help="the installed mcp-id-guard command")
    parser.add_argument("--label", default="probe", help="name for the summary line")
    parser.add_argument("--readme", help="check the README's probe sample against the probe's output")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the server command")
    args = parser.parse_args()
    server_command = args.server[1:] if args.server[:1] == ["--"] else args.server
    server = guard = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        server, server_port = start_server(server_command)
        guard, guard_port = start_guard(args.guard, server_port)
        print(f"  {args.label}: the server alone", flush=True)
        bare_code, bare = probe(args.guard, f"http://127.0.0.1:{server_port}/mcp")
        print(f"  {args.label}: behind mcp-id-guard", flush=True)
        guarded_code, _ = probe(args.guard, f"http://127.0.0.1:{guard_port}/mcp")
        if args.readme:
            print(f"  {args.label}: the README's sample, the server alone and behind mcp-id-guard", flush=True)
            texts = [
                probe_text(args.guard, f"http://127.0.0.1:{server_port}/mcp"),
                probe_text(args.guard, f"http://127.0.0.1:{guard_port}/mcp"),
            ]
    finally:
        stop(guard)
        stop(server)
    verdicts = {check["name"]: check["verdict"] for check in bare["checks"]}
    found = "bug" in (verdicts.get("same-id"), verdicts.get("number-vs-string"))
    checks = [
        ("the server alone: exit 1, a bug on same-id or number-vs-string", bare_code == 1 and found),
        ("behind mcp-id-guard: exit 0", guarded_code == 0),
    ]
    if args.readme:
        samples = readme_samples(args.readme)
        checks.append(("README.md has two probe samples", len(samples) == 2))
        if len(samples) == 2:
            # The README shows the server on 8000 and the proxy on 8080.
            checks.append((
                "README.md's sample of the server alone is the probe's output",
                sample_matches("the server alone", samples[0], texts[0], 8000),
            ))
            checks.append((
                "README.md's sample behind mcp-id-guard is the probe's output",
                sample_matches("behind mcp-id-guard", samples[1], texts[1], 8080),
            ))
    for name, held in checks:
        print(f"  [{'pass' if held else 'FAIL'}] {name}", flush=True)
    failed = sum(not held for _, held in checks)
    print(f"{args.label}: {len(checks) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
