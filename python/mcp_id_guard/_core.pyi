"""The native core of mcp-id-guard (Rust, PyO3): every rule of the guard lives here.

Not a public API: ``mcp_id_guard.IdGuard`` drives it. All calls are
synchronous and short; the driver does all awaiting.
"""

from typing import Dict, List, Literal, Optional, Tuple

Header = Tuple[bytes, bytes]
Action = Literal["pass", "read", "forward", "stream", "answer", "wait", "respond", "closed"]

class Core:
    def __init__(
        self,
        *,
        on_duplicate: Literal["remap", "reject", "queue"] = "remap",
        max_body_bytes: Optional[int] = None,
        max_queue_wait: Optional[float] = None,
        abandoned_id_ttl: Optional[float] = None,
        max_in_flight_per_session: Optional[int] = None,
        max_session_id_bytes: Optional[int] = None,
        max_table_bytes: Optional[int] = None,
        max_body_memory: Optional[int] = None,
        max_body_memory_per_client: Optional[int] = None,
    ) -> None:
        """None takes the crate's default (IdGuardLayer's; for the body budget the proxy's: 64 MiB, half per client)."""
    @property
    def max_queue_wait(self) -> float:
        """Seconds a queued duplicate may wait (the driver times it)."""
    def stats(self) -> Dict[str, int]:
        """Counters and gauges: in_flight_requests, in_flight_sessions, abandoned_ids, passed_total,
        remapped_total, rejected_total, queued_total, restored_total, cancelled_total."""
    def exchange(self, method: str, headers: List[Header], client: Optional[str] = None) -> "Exchange":
        """One per HTTP request (ASGI scope type "http"); headers as in the scope (lower-case names);
        client: the peer's address (scope["client"][0]), whose share of the body budget it draws on."""
    def take_woken(self) -> List[int]:
        """Tokens of queued exchanges whose turn may have come: call it after every admit(),
        response_body(), time_out() and close(), each of which can free an id."""

class Exchange:
    action: Action
    """What the driver does next:

    - "pass": forward request and response untouched
    - "read": feed() each body chunk, then admit()
    - "forward": call the app with request_headers() and request_body() (which
      replaces the client's body), route the response through response_start()
      and response_body()
    - "stream": call the app with request_headers() and the original body,
      route the response through response_start() and response_body()
    - "answer": do not call the app; send answer()
    - "wait": queued; poll_turn() when take_woken() names ``token``

    and, never read by the driver at a decision point: "respond" (the app's
    response is passing through) and "closed" (after close()).
    """
    token: Optional[int]
    """While "wait": the token take_woken() reports when the turn may have come; else None."""
    def feed(self, chunk: bytes) -> bool:
        """False: over max_body_bytes, the action is now "answer"; stop reading."""
    def admit(self) -> Action:
        """The body is complete: decides, and returns the new action."""
    def request_headers(self) -> List[Header]: ...
    def request_body(self) -> bytes: ...
    def answer(self) -> Tuple[int, List[Header], bytes]: ...
    def response_start(self, status: int, headers: List[Header]) -> List[Header]:
        """The response headers to send instead."""
    def response_body(self, chunk: bytes, more_body: bool) -> bytes:
        """The bytes to send now (b"" while an id is held back); once with more_body=False at the end."""
    def poll_turn(self) -> Literal["wait", "forward", "answer"]: ...
    def time_out(self) -> None:
        """The wait ran past max_queue_wait: the action becomes "answer" (503)."""
    def close(self) -> None:
        """Ends the exchange (idempotent). An id is freed only if its answer passed response_body()."""
