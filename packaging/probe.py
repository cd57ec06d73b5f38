"""Runs the installed `mcp-id-guard probe` against a real MCP server, alone and behind the installed proxy.

Usage: probe.py --guard COMMAND [--label NAME] -- SERVER COMMAND...

The server command is started as burst.py starts it (it prints `LISTENING
<port>`). Alone, the server must be found cross-wiring (exit 1, a `bug`
verdict on same-id or number-vs-string); behind `COMMAND --upstream` the
probe must find nothing (exit 0). Every run is bounded; both processes are
stopped on every way out. Exits 0 when both hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guard", required=True, help="the installed mcp-id-guard command")
    parser.add_argument("--label", default="probe", help="name for the summary line")
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
    finally:
        stop(guard)
        stop(server)
    verdicts = {check["name"]: check["verdict"] for check in bare["checks"]}
    found = "bug" in (verdicts.get("same-id"), verdicts.get("number-vs-string"))
    checks = [
        ("the server alone: exit 1, a bug on same-id or number-vs-string", bare_code == 1 and found),
        ("behind mcp-id-guard: exit 0", guarded_code == 0),
    ]
    for name, held in checks:
        print(f"  [{'pass' if held else 'FAIL'}] {name}", flush=True)
    failed = sum(not held for _, held in checks)
    print(f"{args.label}: {len(checks) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
