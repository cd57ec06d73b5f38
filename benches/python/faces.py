"""The Python faces side by side (issue 43): one FastMCP server bare, with
`IdGuard` in process, and behind the `mcp-id-guard` proxy, in one run.

    faces.py --guard PATH/TO/mcp-id-guard [--rounds 10] [--duration 3]
             [--connections 32] [--sessions 8] [--held 1000] [--json]

1. Maximum throughput: each face in turn (the order rotates every round),
   `--connections` keep-alive connections in a closed loop of `tools/call`
   (`echo`, answered at once), unique ids, over `--sessions` sessions, for
   `--duration` seconds. Every answer is checked (status 200, its own
   sentinel and id).
2. Latency at 70 % of the bare server's median maximum: an open loop at that
   rate (requests scheduled at fixed intervals, latency counted from the
   scheduled time, so a stall is not hidden), p50 and p99 per face, every
   round.
3. Memory per held exchange: a fresh server per face; `--held` calls of
   `hold()` (never answered) each on its own connection, over 10 sessions;
   the resident set (the server's, plus the proxy's for the proxy face)
   after every call's response started, less the reading before the calls,
   divided by `--held`.

Ratios are per round against the bare server in the same round, and the
summary gives their medians. Loopback only; every wait is bounded. Prints
one JSON document at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSION = "2025-06-18"
CALL_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class Face:
    """A running server (and proxy) of one face."""

    def __init__(self, name: str, guard: str, json_response: bool) -> None:
        self.name = name
        self.processes: list[subprocess.Popen] = []
        server_face = "inproc" if name == "inproc" else "bare"
        command = [sys.executable, str(HERE / "server.py"), "--face", server_face]
        if json_response:
            command.append("--json")
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.processes.append(server)
        port = self._announced(server)
        if name == "proxy":
            front = free_port()
            proxy = subprocess.Popen(
                [guard, "--listen", f"127.0.0.1:{front}", "--upstream", f"http://127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.processes.append(proxy)
            port = front
            self._wait_accepting(port)
        self.port = port

    @staticmethod
    def _announced(server: subprocess.Popen) -> int:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        if not line or not line[0].startswith("LISTENING "):
            server.kill()
            raise RuntimeError(f"the server did not announce its port: {line}")
        return int(line[0].split()[1])

    @staticmethod
    def _wait_accepting(port: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)  # polling a port that is not open yet: no event to wait for
        raise RuntimeError(f"nothing accepts on {port}")

    def rss_kib(self) -> int:
        return sum(rss_kib(process.pid) for process in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        self.reader, self.writer, self.port = reader, writer, port

    @classmethod
    async def open(cls, port: int) -> "Connection":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, port)

    async def post(self, body: bytes, session: str | None, head_only: bool = False) -> tuple[int, dict, bytes]:
        headers = [
            "POST /mcp HTTP/1.1",
            f"host: 127.0.0.1:{self.port}",
            "content-type: application/json",
            "accept: application/json, text/event-stream",
            f"mcp-protocol-version: {VERSION}",
            f"content-length: {len(body)}",
        ]
        if session:
            headers.append(f"mcp-session-id: {session}")
        self.writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        fields: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            fields[name.strip().lower()] = value.strip()
        if head_only:
            return status, fields, b""
        if "content-length" in fields:
            data = await self.reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            data = b"".join(parts)
        else:
            data = b""
        return status, fields, data

    def close(self) -> None:
        self.writer.close()


async def open_sessions(port: int, count: int) -> list[str]:
    sessions = []
    connection = await Connection.open(port)
    for n in range(count):
        init = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
            }
        ).encode()
        status, fields, _ = await connection.post(init, None)
        session = fields["mcp-session-id"]
        note = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
        await connection.post(note, session)
        assert status == 200, status
        sessions.append(session)
    connection.close()
    return sessions


def call(rpc_id: int, sentinel: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {"name": "echo", "arguments": {"sentinel": sentinel}}}
    ).encode()


async def checked_call(connection: Connection, session: str, rpc_id: int) -> None:
    sentinel = f"s{rpc_id}"
    status, _, data = await asyncio.wait_for(connection.post(call(rpc_id, sentinel), session), CALL_TIMEOUT_S)
    if status != 200 or f"ECHO:{sentinel}".encode() not in data or f'"id":{rpc_id}'.encode() not in data:
        raise RuntimeError(f"a wrong answer: {status} {data[:300]!r}")


async def throughput(face: Face, sessions: list[str], connections: int, duration: float) -> float:
    done = 0
    stop_at = time.monotonic() + duration

    async def worker(index: int) -> None:
        nonlocal done
        connection = await Connection.open(face.port)
        rpc_id = index * 10_000_000
        try:
            while time.monotonic() < stop_at:
                rpc_id += 1
                await checked_call(connection, sessions[index % len(sessions)], rpc_id)
                done += 1
        finally:
            connection.close()

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return done / (time.monotonic() - started)


async def latency(face: Face, sessions: list[str], rate: float, duration: float, pool: int) -> tuple[float, float]:
    free: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(pool):
        free.put_nowait(await Connection.open(face.port))
    latencies: list[float] = []
    start = time.monotonic()
    count = int(rate * duration)

    async def one(n: int, due: float) -> None:
        connection = await free.get()
        try:
            await checked_call(connection, sessions[n % len(sessions)], 50_000_000 + n)
        finally:
            free.put_nowait(connection)
        latencies.append(time.monotonic() - due)

    tasks = []
    for n in range(count):
        due = start + n / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the open loop's schedule, not synchronisation
        tasks.append(asyncio.ensure_future(one(n, due)))
    await asyncio.gather(*tasks)
    while not free.empty():
        free.get_nowait().close()
    latencies.sort()
    return latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


async def held_memory(face: Face, held: int) -> float:
    sessions = await open_sessions(face.port, 10)
    connections = [await Connection.open(face.port) for _ in range(held)]
    before = face.rss_kib()
    hold = lambda n: json.dumps(  # noqa: E731
        {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "hold", "arguments": {}}}
    ).encode()
    statuses = await asyncio.wait_for(
        asyncio.gather(*(c.post(hold(n), sessions[n % 10], head_only=True) for n, c in enumerate(connections))),
        60,
    )
    assert all(status == 200 for status, _, _ in statuses), "every held call's response started"
    after = face.rss_kib()
    for connection in connections:
        connection.close()
    return (after - before) / held


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--guard", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = ["bare", "inproc", "proxy"]
    faces = {name: Face(name, args.guard, args.json) for name in names}
    result: dict = {"rounds": args.rounds, "duration_s": args.duration, "connections": args.connections}
    try:
        sessions = {name: asyncio.run(open_sessions(face.port, args.sessions)) for name, face in faces.items()}
        for name, face in faces.items():  # warm-up, unmeasured
            asyncio.run(throughput(face, sessions[name], args.connections, 1.0))
        rates: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names[round_ % 3 :] + names[: round_ % 3]
            for name in order:
                rates[name].append(asyncio.run(throughput(faces[name], sessions[name], args.connections, args.duration)))
            print(f"round {round_}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s" for n in names), file=sys.stderr)
        bare_max = statistics.median(rates["bare"])
        result["max_rps"] = {name: statistics.median(rates[name]) for name in names}
        result["max_ratio_median"] = {
            name: statistics.median(r / b for r, b in zip(rates[name], rates["bare"])) for name in names
        }
        rate = 0.7 * bare_max
        p50: dict[str, list[float]] = {name: [] for name in names}
        p99: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names[round_ % 3 :] + names[: round_ % 3]
            for name in order:
                a, b = asyncio.run(latency(faces[name], sessions[name], rate, args.duration, args.connections * 2))
                p50[name].append(a)
                p99[name].append(b)
            print(f"latency round {round_}: " + ", ".join(f"{n} p99 {p99[n][-1] * 1000:.1f} ms" for n in names), file=sys.stderr)
        result["rate_at_70pct"] = rate
        result["p50_ms_median"] = {n: statistics.median(p50[n]) * 1000 for n in names}
        result["p99_ms_median"] = {n: statistics.median(p99[n]) * 1000 for n in names}
        result["p99_ratio_median"] = {n: statistics.median(a / b for a, b in zip(p99[n], p99["bare"])) for n in names}
        result["p50_ratio_median"] = {n: statistics.median(a / b for a, b in zip(p50[n], p50["bare"])) for n in names}
    finally:
        for face in faces.values():
            face.stop()
    memory = {}
    for name in names:
        face = Face(name, args.guard, args.json)
        try:
            memory[name] = asyncio.run(held_memory(face, args.held))
        finally:
            face.stop()
    result["held_kib_per_exchange"] = memory
    result["held_kib_added"] = {n: memory[n] - memory["bare"] for n in names}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
