"""Shows what happens to a polled request's answer when its id is reused while it runs.

Usage: polling.py --url BASE [--b-id 1|2] [--early] [--trials N]
       polling.py --guard COMMAND [--label NAME] -- SERVER COMMAND...

SEP-1699 polling (protocol 2025-11-25): the server may close a request's SSE
stream after a priming event and go on running the request; the client gets
the answer by resuming with `GET` and `Last-Event-ID`. The request is still in
flight on the server although its POST has ended. Each trial, in a session of
its own, with raw HTTP so every id is the one written here:

  A  POST tools/call slow_echo, `id: 1`; the server sends the priming event,
     closes the stream and answers a second later (into its event store)
  B  once A's stream has ended and 0.3 s after A was sent: POST tools/call
     echo, `id: 1` (or `id: 2`, the control), answered at once
  A  resumes: GET with Last-Event-ID (the last event id it saw), again after
     the server's `retry` while a stream ends without its answer, until the
     first JSON-RPC response with id 1 or the deadline; with `--early`, A
     resumes before B is sent (B waits for the resumed stream's first event)

A trial says whether A and B each got their own answer: OK, SWAPPED (someone
else's), NONE (a stream ended without one, no more resumption possible),
HUNG (the wall-clock deadline passed: an SSE keep-alive must not keep a read
going, so every read has one), ERROR.

With `--url` it runs the trials against a server (or a proxy in front of one)
already listening at BASE (path /mcp) and exits 0 when every trial got both
answers right. With `--guard` it starts the server command (see
python/fastmcp_polling_server.py; it must print `LISTENING <port>` first) and
the guard command in front of it, as burst.py does, and checks:

  bare          straight to the server, B with id 1: A or B loses its
                answer in every trial, or the test proves nothing
  control       straight to the server, B with id 2: both right
  bare early, control early: the same with A resuming before B is sent (a
                client honouring the server's `retry` does; A's resumed
                stream is open on the server when B arrives)
  guarded       through the guard (default flags), B with id 1: both right
  guarded control: B with id 2, both right
  guarded early: B with id 1, A resuming before B is sent: both right
  rewrite       through a second guard with --rewrite-all-ids, B with id 1:
                both right (the server never sees an id twice, so this holds
                even where the guard releases a polled id too early: it shows
                that resuming through the proxy works)

Traffic stays on 127.0.0.1. Exits 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from burst import log, same_id, start_guard, start_server, stop

TRIALS = 3
PROTOCOL_VERSION = "2025-11-25"
# Longest any one HTTP exchange (a whole SSE stream included) may take, and
# longest A may spend resuming. The slow tool answers after 1 s; the rest is
# room for a slow, shared CI machine.
DEADLINE_S = 8.0
# B's call follows A's by this much, as in the report of issue #19.
B_AFTER_A_S = 0.3
# When the server sends no `retry`, the client waits this long to resume.
DEFAULT_RETRY_S = 0.1
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": PROTOCOL_VERSION,
}


@dataclass
class Outcome:
    verdict: str  # OK, SWAPPED, NONE, HUNG, ERROR
    detail: str = ""


@dataclass
class Stream:
    """What one HTTP response brought: the first JSON-RPC response, SSE bookkeeping."""

    response: dict | None = None
    last_event_id: str | None = None
    retry_s: float | None = None
    hung: bool = False
    error: str = ""
    events: int = 0
    session: str | None = None


@dataclass
class Trial:
    a: Outcome
    b: Outcome
    resumptions: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def both_right(self) -> bool:
        return self.a.verdict == "OK" and self.b.verdict == "OK"


def is_response(message: object) -> bool:
    return isinstance(message, dict) and "id" in message and ("result" in message or "error" in message)


async def read_stream(
    response: httpx.Response, stream: Stream, wanted_id: object, on_event: Callable[[], None] | None
) -> None:
    """Reads SSE events (or a JSON body) until a response with wanted_id, or the end."""
    stream.session = response.headers.get("mcp-session-id")
    if response.status_code != 200:
        body = (await response.aread())[:200]
        stream.error = f"HTTP {response.status_code}: {body!r}"
        return
    if response.headers.get("content-type", "").startswith("application/json"):
        message = json.loads(await response.aread())
        if is_response(message) and same_id(wanted_id, message.get("id")):
            stream.response = message
        return
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith(":"):  # a comment: the SDK's keep-alive ping
            continue
        if line:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                stream.last_event_id = value
            elif name == "data":
                data.append(value)
            elif name == "retry" and value.isdigit():
                stream.retry_s = int(value) / 1000
            continue
        # A blank line ends an event.
        stream.events += 1
        if on_event is not None:
            on_event()
        payload, data = "\n".join(data), []
        if not payload:  # the priming event
            continue
        message = json.loads(payload)
        if is_response(message) and same_id(wanted_id, message.get("id")):
            stream.response = message
            return


async def exchange(
    client: httpx.AsyncClient,
    request: httpx.Request,
    wanted_id: object,
    on_event: Callable[[], None] | None = None,
) -> Stream:
    """Sends one request and reads its stream, within DEADLINE_S of wall-clock time."""
    stream = Stream()

    async def run() -> None:
        response = await client.send(request, stream=True)
        try:
            await read_stream(response, stream, wanted_id, on_event)
        finally:
            await response.aclose()

    try:
        await asyncio.wait_for(run(), timeout=DEADLINE_S)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        stream.hung = True
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        stream.error = f"{type(error).__name__}: {error}"
    return stream


def judge(stream: Stream, wanted_id: object, expected_text: str) -> Outcome:
    if stream.hung:
        return Outcome("HUNG", f"no answer within {DEADLINE_S:.0f} s")
    if stream.error:
        return Outcome("ERROR", stream.error)
    message = stream.response
    if message is None:
        return Outcome("NONE", f"the stream ended after {stream.events} event(s) without an answer")
    if "error" in message:
        return Outcome("ERROR", f"JSON-RPC error {json.dumps(message['error'])[:200]}")
    try:
        text = message["result"]["content"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return Outcome("ERROR", f"no text content: {json.dumps(message)[:200]}")
    if text != expected_text:
        return Outcome("SWAPPED", f"got {text[:13]!r}, wanted {expected_text[:13]!r}")
    return Outcome("OK")


def tools_call(url: str, session: str, rpc_id: object, tool: str, sentinel: str) -> httpx.Request:
    body = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"sentinel": sentinel}},
    }
    return httpx.Request("POST", url, headers={**HEADERS, "mcp-session-id": session}, json=body)


async def open_session(client: httpx.AsyncClient, url: str) -> str:
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "mcp-id-guard-polling-test", "version": "0"},
        },
    }
    stream = await exchange(client, httpx.Request("POST", url, headers=HEADERS, json=initialize), 0)
    if stream.hung or stream.error or stream.response is None:
        raise RuntimeError(f"initialize failed: {stream.error or 'no answer'}")
    negotiated = stream.response.get("result", {}).get("protocolVersion")
    if negotiated != PROTOCOL_VERSION:
        raise RuntimeError(f"the server negotiated protocol {negotiated!r}, not {PROTOCOL_VERSION}: no polling")
    session = stream.session
    if not session:
        raise RuntimeError("the server gave no Mcp-Session-Id: it is not stateful")
    initialized = await asyncio.wait_for(
        client.post(
            url,
            headers={**HEADERS, "mcp-session-id": session},
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        ),
        timeout=DEADLINE_S,
    )
    if initialized.status_code not in (200, 202):
        raise RuntimeError(f"notifications/initialized got HTTP {initialized.status_code}")
    return session


async def resume(
    client: httpx.AsyncClient, url: str, session: str, a_id: object, stream: Stream, on_event: Callable[[], None]
) -> tuple[Stream, int]:
    """Resumes A's stream, as often as it ends without A's answer, until DEADLINE_S has passed."""
    resumptions = 0
    deadline = time.monotonic() + DEADLINE_S
    while stream.response is None and not stream.hung and not stream.error and stream.last_event_id is not None:
        if time.monotonic() > deadline:
            stream.hung = True
            break
        await asyncio.sleep(stream.retry_s if stream.retry_s is not None else DEFAULT_RETRY_S)
        headers = {
            "accept": "text/event-stream",
            "mcp-protocol-version": PROTOCOL_VERSION,
            "mcp-session-id": session,
            "last-event-id": stream.last_event_id,
        }
        resumed = await exchange(client, httpx.Request("GET", url, headers=headers), a_id, on_event)
        resumptions += 1
        # A stream without events of its own keeps the last id seen.
        resumed.last_event_id = resumed.last_event_id or stream.last_event_id
        resumed.retry_s = resumed.retry_s if resumed.retry_s is not None else stream.retry_s
        stream = resumed
    return stream, resumptions


async def trial(base: str, b_id: object, early: bool) -> Trial:
    """One trial; `early`: A resumes before B is sent (as a client that honours `retry` does)."""
    url = f"{base}/mcp"
    a_id = 1
    a_sentinel, b_sentinel = uuid.uuid4().hex, uuid.uuid4().hex
    # trust_env=False: no proxy variable may send this traffic off the machine.
    async with httpx.AsyncClient(trust_env=False, timeout=DEADLINE_S) as client:
        session = await open_session(client, url)
        a_sent = time.monotonic()
        a_post = await exchange(client, tools_call(url, session, a_id, "slow_echo", a_sentinel), a_id)
        notes = []
        if a_post.response is not None or a_post.last_event_id is None:
            # The server answered on the POST or sent no priming event: it
            # did not poll, and the trial shows nothing about polling.
            notes.append("A's POST stream was not closed for polling")
        resumed_stream_open = asyncio.Event()
        resuming = None
        if early:
            resuming = asyncio.create_task(resume(client, url, session, a_id, a_post, resumed_stream_open.set))
            # The server has A's resumed stream in place once it sent an event
            # on it (the priming event): only then is B sent.
            try:
                await asyncio.wait_for(resumed_stream_open.wait(), timeout=DEADLINE_S)
            except asyncio.TimeoutError:
                notes.append("A's resumed stream brought no event before B was sent")
        # The ordering that matters is that A's stream has ended (and, early,
        # that A's resumed one is open); the pause keeps the report's timing.
        await asyncio.sleep(max(0.0, a_sent + B_AFTER_A_S - time.monotonic()))
        b_stream = await exchange(client, tools_call(url, session, b_id, "echo", b_sentinel), b_id)
        b = judge(b_stream, b_id, f"ECHO:{b_sentinel}")
        if resuming is None:
            resuming = asyncio.create_task(resume(client, url, session, a_id, a_post, resumed_stream_open.set))
        a_stream, resumptions = await resuming
        a = judge(a_stream, a_id, f"SLOW:{a_sentinel}")

        try:
            await asyncio.wait_for(client.delete(url, headers={**HEADERS, "mcp-session-id": session}), DEADLINE_S)
        except (asyncio.TimeoutError, httpx.HTTPError):
            pass  # the session ends with the server anyway
        return Trial(a, b, resumptions, notes)


async def trials(base: str, b_id: object, count: int, early: bool = False) -> list[Trial]:
    return [await trial(base, b_id, early) for _ in range(count)]


def describe(label: str, results: list[Trial]) -> list[str]:
    lines = []
    for number, result in enumerate(results, 1):
        lines.append(
            f"      {label} trial {number}: A {result.a.verdict} {result.a.detail}".rstrip()
            + f"; B {result.b.verdict} {result.b.detail}".rstrip()
            + f"; {result.resumptions} resumption(s)"
            + "".join(f"; {note}" for note in result.notes)
        )
    return lines


def summary(results: list[Trial]) -> str:
    a_right = sum(r.a.verdict == "OK" for r in results)
    b_right = sum(r.b.verdict == "OK" for r in results)
    hung = sum("HUNG" in (r.a.verdict, r.b.verdict) for r in results)
    return f"A right {a_right}/{len(results)}, B right {b_right}/{len(results)}, hung {hung}"


@dataclass
class Run:
    """One run of trials and what it must show."""

    name: str
    target: str  # "direct", "guarded" or "rewriting"
    b_id: int
    early: bool
    must_lose: bool  # the bare case: an answer lost in every trial

    def describe(self) -> str:
        where = {
            "direct": "straight to the server",
            "guarded": "through mcp-id-guard",
            "rewriting": "through mcp-id-guard --rewrite-all-ids",
        }[self.target]
        when = "A resumes before B" if self.early else "A resumes after B"
        what = "B reuses id 1 while A is polled" if self.b_id == 1 else "B uses id 2"
        verdict = "an answer is lost in every trial" if self.must_lose else "both answers right"
        return f"{self.name}: {where}, {what}, {when}: {verdict}"


RUNS = [
    Run("bare", "direct", 1, early=False, must_lose=True),
    Run("control", "direct", 2, early=False, must_lose=False),
    Run("bare early", "direct", 1, early=True, must_lose=True),
    Run("control early", "direct", 2, early=True, must_lose=False),
    Run("guarded", "guarded", 1, early=False, must_lose=False),
    Run("guarded control", "guarded", 2, early=False, must_lose=False),
    Run("guarded early", "guarded", 1, early=True, must_lose=False),
    Run("rewrite", "rewriting", 1, early=False, must_lose=False),
]


def run_checks(label: str, guard_command: str, server_command: list[str], count: int) -> int:
    server = guard = rewriting_guard = None
    try:
        server, server_port = start_server(server_command)
        guard, guard_port = start_guard(guard_command, server_port)
        rewriting_guard, rewriting_port = start_guard(guard_command, server_port, ("--rewrite-all-ids",))
        bases = {
            "direct": f"http://127.0.0.1:{server_port}",
            "guarded": f"http://127.0.0.1:{guard_port}",
            "rewriting": f"http://127.0.0.1:{rewriting_port}",
        }
        started = time.monotonic()
        results = [asyncio.run(trials(bases[run.target], run.b_id, count, run.early)) for run in RUNS]
        elapsed = time.monotonic() - started
    except Exception as error:  # noqa: BLE001 — any failure to set up is a test failure
        log(f"{label}: FAIL — could not run the trials: {type(error).__name__}: {error}")
        log(f"{label}: 0 passed, 1 failed")
        return 1
    finally:
        stop(rewriting_guard)
        stop(guard)
        stop(server)

    failed = 0
    for run, outcomes in zip(RUNS, results):
        # A trial whose server did not poll shows nothing either way.
        polled = not any(trial.notes for trial in outcomes)
        if run.must_lose:
            held = polled and not any(trial.both_right for trial in outcomes)
        else:
            held = polled and all(trial.both_right for trial in outcomes)
        failed += not held
        log(f"  [{'pass' if held else 'FAIL'}] {run.describe()}: {summary(outcomes)}")
        for line in describe(run.name, outcomes):
            log(line)
    by_name = {run.name: outcomes for run, outcomes in zip(RUNS, results)}
    verdict = "PASS" if failed == 0 else "FAIL"
    log(
        f"{label}: {verdict} — polled id reused: without the guard {summary(by_name['bare'])} "
        f"(resuming early: {summary(by_name['bare early'])}); through it {summary(by_name['guarded'])} "
        f"(early: {summary(by_name['guarded early'])}); {len(RUNS) * count} trials took {elapsed:.1f} s"
    )
    log(f"{label}: {len(RUNS) - failed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def run_in_process(label: str, server_command: list[str], count: int) -> int:
    """The guarded runs against a server whose app IdGuard wraps in process."""
    server = None
    os.environ["MCP_ID_GUARD_IN_PROCESS"] = "1"
    try:
        server, port = start_server(server_command)
        runs = [run for run in RUNS if run.target == "guarded"]
        results = [asyncio.run(trials(f"http://127.0.0.1:{port}", run.b_id, count, run.early)) for run in runs]
    except Exception as error:  # noqa: BLE001 — any failure to set up is a test failure
        log(f"{label}: FAIL — could not run the trials: {type(error).__name__}: {error}")
        return 1
    finally:
        stop(server)
    failed = 0
    for run, outcomes in zip(runs, results):
        held = not any(trial.notes for trial in outcomes) and all(trial.both_right for trial in outcomes)
        failed += not held
        log(f"  [{'pass' if held else 'FAIL'}] {run.describe()} (IdGuard in process): {summary(outcomes)}")
        for line in describe(run.name, outcomes):
            log(line)
    log(f"{label}: {len(runs) - failed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="base URL of a running server or proxy (the trials use <url>/mcp)")
    target.add_argument("--guard", help="the installed mcp-id-guard command (starts the server and the guard)")
    target.add_argument(
        "--in-process",
        action="store_true",
        help="start the server command with MCP_ID_GUARD_IN_PROCESS=1 (it wraps its app in IdGuard) "
        "and run the guarded trials against it",
    )
    parser.add_argument("--b-id", type=int, default=1, help="with --url: B's id (1 reuses A's, 2 is the control)")
    parser.add_argument("--trials", type=int, default=TRIALS, help="trials per run")
    parser.add_argument("--early", action="store_true", help="with --url: A resumes before B is sent")
    parser.add_argument("--label", default="polling", help="name for the summary line")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="with --guard: -- then the server command")
    args = parser.parse_args()
    # SIGTERM (the shell script's trap) ends the run through the `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.in_process:
        server_command = args.server[1:] if args.server[:1] == ["--"] else args.server
        if not server_command:
            parser.error("give the server command after --")
        return run_in_process(args.label, server_command, args.trials)

    if args.guard:
        server_command = args.server[1:] if args.server[:1] == ["--"] else args.server
        if not server_command:
            parser.error("give the server command after --")
        return run_checks(args.label, args.guard, server_command, args.trials)

    results = asyncio.run(trials(args.url.rstrip("/"), args.b_id, args.trials, args.early))
    for line in describe(f"B id {args.b_id}", results):
        log(line)
    log(f"{args.label}: {summary(results)}")
    return 0 if all(result.both_right for result in results) and not any(r.notes for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
