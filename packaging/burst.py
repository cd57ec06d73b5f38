"""Shows an installed `mcp-id-guard` command keeping a real MCP server's answers apart.

Usage: burst.py --guard COMMAND [--label NAME] [--guard-runs-server] -- SERVER COMMAND...

The server command must start a stateful streamable-HTTP MCP server on a free
loopback port, serving an `echo(sentinel)` tool at /mcp that answers
`ECHO:<sentinel>` after a random delay, and print `LISTENING <port>` as its
first line on stdout. This script starts it, starts the guard command in
front of it (only `--listen` and `--upstream` are passed), and sends bursts of
concurrent `tools/call` POSTs, each burst in its own session:

  control   straight to the server, every call `id: 1`: must go wrong (some
            answer missing or someone else's), or the test proves nothing
  unique    straight to the server, unique ids: all right (the server works)
  guarded   through the guard, every call `id: 1`: all right
  mixed     through the guard, half `id: 1`, half `id: "1"` (one id to the
            Python SDK, which routes by str(id)): all right, each with its
            own id back, type included

Every call has a wall-clock deadline (an orphaned SSE stream gets keep-alive
pings forever, so a read timeout alone would not end it), every wait is
bounded, and both processes are stopped on every way out. Traffic stays on
127.0.0.1. Exits 0 when every check holds, 1 otherwise.

With --guard-runs-server the guard starts the server itself, as a user runs
one: `mcp-id-guard --listen 127.0.0.1:G --upstream-port S -- SERVER COMMAND...`
(the server listens on $PORT); the control bursts still go straight to port
S. At the end, SIGTERM to the guard must stop the server too (passed on) and
the guard must exit with the server's status, 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import httpx

CALLS = 12
# Longest a single call may take. The tool sleeps at most 0.5 s; the rest is
# room for a slow, shared CI machine. A hung call costs this much once.
CALL_DEADLINE_S = 8.0
STARTUP_DEADLINE_S = 30.0
PROTOCOL_VERSION = "2025-06-18"
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": PROTOCOL_VERSION,
}


@dataclass
class Outcome:
    sent_id: object
    sentinel: str
    verdict: str  # OK, SWAPPED, WRONG_ID, TIMEOUT, ERROR
    detail: str = ""


def log(message: str) -> None:
    print(message, flush=True)


def read_response(text: str) -> dict | None:
    """The JSON-RPC response in an SSE stream or a JSON body, if any."""
    candidates = []
    stripped = text.strip()
    if stripped.startswith("{"):
        candidates.append(stripped)
    candidates += [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for candidate in candidates:
        try:
            message = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(message, dict) and ("result" in message or "error" in message):
            return message
    return None


def same_id(sent: object, got: object) -> bool:
    # `1 == True` in Python; a JSON-RPC id is never a boolean.
    return type(sent) is type(got) and sent == got


async def open_session(client: httpx.AsyncClient, url: str) -> str:
    response = await client.post(
        url,
        headers=HEADERS,
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "mcp-id-guard-packaging-test", "version": "0"},
            },
        },
    )
    response.raise_for_status()
    session = response.headers.get("mcp-session-id")
    if not session:
        raise RuntimeError("the server gave no Mcp-Session-Id: it is not stateful")
    initialized = await client.post(
        url,
        headers={**HEADERS, "mcp-session-id": session},
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
    )
    if initialized.status_code not in (200, 202):
        raise RuntimeError(f"notifications/initialized got HTTP {initialized.status_code}")
    return session


async def call_echo(client: httpx.AsyncClient, url: str, session: str, rpc_id: object) -> Outcome:
    sentinel = uuid.uuid4().hex
    body = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"sentinel": sentinel}},
    }
    try:
        response = await asyncio.wait_for(
            client.post(url, headers={**HEADERS, "mcp-session-id": session}, json=body),
            timeout=CALL_DEADLINE_S,
        )
    except (asyncio.TimeoutError, httpx.TimeoutException):
        return Outcome(rpc_id, sentinel, "TIMEOUT")
    except httpx.HTTPError as error:
        return Outcome(rpc_id, sentinel, "ERROR", f"{type(error).__name__}: {error}")
    message = read_response(response.text)
    if response.status_code != 200 or message is None or "error" in message:
        return Outcome(rpc_id, sentinel, "ERROR", f"HTTP {response.status_code}: {response.text[:200]!r}")
    if not same_id(rpc_id, message.get("id")):
        return Outcome(rpc_id, sentinel, "WRONG_ID", f"id {message.get('id')!r}")
    try:
        text = message["result"]["content"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return Outcome(rpc_id, sentinel, "ERROR", f"no text content: {json.dumps(message)[:200]}")
    if text != f"ECHO:{sentinel}":
        return Outcome(rpc_id, sentinel, "SWAPPED", f"got {text!r}")
    return Outcome(rpc_id, sentinel, "OK")


async def burst(base: str, ids: list[object]) -> list[Outcome]:
    url = f"{base}/mcp"
    # trust_env=False: no proxy variable may send this traffic off the machine.
    limits = httpx.Limits(max_connections=len(ids) + 4, max_keepalive_connections=len(ids) + 4)
    async with httpx.AsyncClient(trust_env=False, timeout=CALL_DEADLINE_S, limits=limits) as client:
        session = await asyncio.wait_for(open_session(client, url), timeout=CALL_DEADLINE_S)
        return list(await asyncio.gather(*(call_echo(client, url, session, rpc_id) for rpc_id in ids)))


def tally(outcomes: list[Outcome]) -> str:
    counts = {}
    for outcome in outcomes:
        counts[outcome.verdict] = counts.get(outcome.verdict, 0) + 1
    order = ["OK", "SWAPPED", "WRONG_ID", "TIMEOUT", "ERROR"]
    return " ".join(f"{verdict}={counts.get(verdict, 0)}" for verdict in order)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_accepting(port: int, process: subprocess.Popen, what: str) -> None:
    """Connects until the port accepts, the process dies or the deadline passes."""
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} before accepting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not accept on 127.0.0.1:{port} within {STARTUP_DEADLINE_S:.0f} s")
            time.sleep(0.05)


def start_server(command: list[str]) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        return server, announced_port(server)
    except BaseException:
        stop(server)
        raise


def announced_port(server: subprocess.Popen) -> int:
    announced: list[str] = []

    def read_first_line() -> None:
        announced.append(server.stdout.readline())

    # The announcement is read on a thread so a server that never prints
    # cannot hang the test.
    reader = threading.Thread(target=read_first_line, daemon=True)
    reader.start()
    reader.join(STARTUP_DEADLINE_S)
    line = announced[0].strip() if announced else ""
    if not line.startswith("LISTENING "):
        if announced:  # end of its output: the server is exiting
            try:
                status = server.wait(timeout=5)
                raise RuntimeError(f"the server exited with status {status} before announcing its port")
            except subprocess.TimeoutExpired:
                pass
        raise RuntimeError(f"the server did not announce its port within {STARTUP_DEADLINE_S:.0f} s (got {line!r})")
    port = int(line.split()[1])
    wait_until_accepting(port, server, "the server")
    return port


def start_guard(command: str, upstream_port: int, flags: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    # A port picked here could be taken by someone else before the guard binds
    # it; the guard then exits at once, and another port is tried.
    last_error = None
    for _ in range(3):
        port = free_loopback_port()
        guard = subprocess.Popen(
            [command, "--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{upstream_port}", *flags],
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "error")},
        )
        try:
            wait_until_accepting(port, guard, "mcp-id-guard")
            return guard, port
        except RuntimeError as error:
            last_error = error
            stop(guard)
    raise RuntimeError(str(last_error))


def start_guard_with_server(command: str, server_command: list[str]) -> tuple[subprocess.Popen, int, int]:
    last_error = None
    for _ in range(3):
        server_port, port = free_loopback_port(), free_loopback_port()
        guard = subprocess.Popen(
            [command, "--listen", f"127.0.0.1:{port}", "--upstream-port", str(server_port), "--", *server_command],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "error")},
        )
        try:
            # The guard accepts once the server does (it starts serving then).
            wait_until_accepting(server_port, guard, "the server started by mcp-id-guard")
            wait_until_accepting(port, guard, "mcp-id-guard")
            return guard, port, server_port
        except RuntimeError as error:
            last_error = error
            stop(guard)
    raise RuntimeError(str(last_error))


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guard", required=True, help="the installed mcp-id-guard command")
    parser.add_argument("--label", default="mcp-id-guard", help="name for the summary line")
    parser.add_argument(
        "--guard-runs-server",
        action="store_true",
        help="start the server as the guard's child (--upstream-port S -- SERVER COMMAND)",
    )
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the server command")
    args = parser.parse_args()
    server_command = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not server_command:
        parser.error("give the server command after --")

    server = guard = None
    # SIGTERM (the shell script's trap) ends the run through the `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.guard_runs_server:
            guard, guard_port, server_port = start_guard_with_server(args.guard, server_command)
        else:
            server, server_port = start_server(server_command)
            guard, guard_port = start_guard(args.guard, server_port)
        direct = f"http://127.0.0.1:{server_port}"
        guarded = f"http://127.0.0.1:{guard_port}"

        started = time.monotonic()
        control = asyncio.run(burst(direct, [1] * CALLS))
        unique = asyncio.run(burst(direct, list(range(100, 100 + CALLS))))
        through = asyncio.run(burst(guarded, [1] * CALLS))
        mixed = asyncio.run(burst(guarded, [1, "1"] * (CALLS // 2)))
        elapsed = time.monotonic() - started
        if args.guard_runs_server:
            stop(guard)
            guard_status = guard.returncode
            server_gone = not accepts(server_port)
    except Exception as error:  # noqa: BLE001 — any failure to set up is a test failure
        log(f"{args.label}: FAIL — could not run the bursts: {type(error).__name__}: {error}")
        log(f"{args.label}: 0 passed, 1 failed")
        return 1
    finally:
        stop(guard)
        stop(server)

    checks = [
        ("control: 12 x id 1 straight to the server go wrong", any(o.verdict != "OK" for o in control), control),
        ("unique ids straight to the server: 12/12 right", all(o.verdict == "OK" for o in unique), unique),
        ("12 x id 1 through mcp-id-guard: 12/12 right", all(o.verdict == "OK" for o in through), through),
        ('6 x id 1 + 6 x id "1" through mcp-id-guard: 12/12 right', all(o.verdict == "OK" for o in mixed), mixed),
    ]
    if args.guard_runs_server:
        checks.append(
            (
                f"SIGTERM to mcp-id-guard stops the server it started (exit {guard_status}, server gone: {server_gone})",
                guard_status == 0 and server_gone,
                [],
            )
        )
    failed = 0
    for name, held, outcomes in checks:
        failed += not held
        log(f"  [{'pass' if held else 'FAIL'}] {name}" + (f": {tally(outcomes)}" if outcomes else ""))
        for outcome in outcomes:
            # Hung calls are counted in the tally; list each one only when it matters.
            if outcome.verdict != "OK" and (not held or outcome.verdict != "TIMEOUT"):
                log(f"      id {outcome.sent_id!r} {outcome.sentinel[:8]}: {outcome.verdict} {outcome.detail}")
    verdict = "PASS" if failed == 0 else "FAIL"
    log(
        f"{args.label}: {verdict} — without the guard {tally(control)} of {CALLS} (id 1 each); "
        f"through it {tally(through)}; bursts took {elapsed:.1f} s"
    )
    log(f"{args.label}: {len(checks) - failed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
