//! Tower middleware that stops MCP servers from delivering one caller's
//! response to another.
//!
//! # The problem
//! In the stateful streamable-HTTP transport of MCP (protocol revisions
//! 2025-03-26 to 2025-11-25), a server routes each response back to the POST
//! that asked for it by JSON-RPC request id alone; the official Python,
//! TypeScript and Rust (rmcp) SDKs all do. When two POSTs in one
//! `Mcp-Session-Id` carry the same id at the same time, the later one receives
//! the earlier one's result, its own result is dropped, and the earlier one
//! hangs. The spec forbids reusing an id in flight, but widely used clients
//! send every request with `id: 1` and share one session across
//! conversations.
//!
//! # Quick start
//! ```toml
//! [dependencies]
//! mcp-id-guard = "0.1"
//! rmcp = { version = "3.11", features = ["server", "macros", "transport-streamable-http-server"] }
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net", "signal"] }
//! tower = "0.5"
//! serde = { version = "1", features = ["derive"] }
//! schemars = "1"
//! # The recommended stack of "Where to put other layers" (0.6 works too):
//! tower-http = { version = "0.7", features = ["trace", "timeout", "cors", "compression-gzip"] }
//! ```
//!
//! Put [`IdGuardLayer`] outside the MCP service, so it sees every POST of a
//! session before the server does, and the network protections
//! ([`protect::ProtectLayer`]) outside the guard. The whole program
//! (`examples/quickstart.rs`, also README's quick start):
//!
#![doc = concat!("```no_run\n", include_str!("../examples/quickstart.rs"), "```")]
//!
//! # The crate at a glance
//! | path | what for |
//! |---|---|
//! | [`IdGuardLayer`], [`IdGuard`] | the middleware: the layer and its settings, the service it makes |
//! | [`OnDuplicate`] | what happens to a request whose id is already in flight (see [Policies](#policies)) |
//! | [`Stats`] | the guard's counters, from [`IdGuardLayer::stats`] |
//! | [`protect`] | the network protections: [`ProtectLayer`](protect::ProtectLayer) and its three layers, [`metrics`](protect::metrics) |
//! | [`exchange`] | what the guard did with each message, for layers outside it (metrics, traces, your own) |
//! | [`guard`] | the guard's body and future types, to name in bounds |
//! | [`inner`] | for the service inside the guard: its request type, server-side ids, stand-in answers |
//! | [`proxy`], [`server`] | a reverse proxy to any upstream MCP server, and the connection-level protections (features `proxy`, `server`) |
//!
//! The layer works on any `Service<http::Request<B>>` whose response is an
//! `http::Response`: an rmcp `StreamableHttpService`, an axum `Router`, a
//! forwarding proxy ([`proxy`], feature `proxy`). Servers in other languages
//! get the same protection from the `mcp-id-guard` reverse-proxy binary
//! (feature `cli`).
//!
//! # Policies
//! | [`OnDuplicate`] | a request whose id is already in flight in its session | the client sees |
//! |---|---|---|
//! | `Remap` (default) | goes to the server with a unique server-side id | its own result, with its own id restored byte for byte |
//! | `Reject` | never reaches the server | `reject_status` (400) and JSON-RPC `-32600` carrying its id |
//! | `Queue` | waits, first come first served per session and id, until the earlier exchange ends, then goes with its own id | its own result, later; `503` after `max_queue_wait` |
//!
//! An id is released exactly once, however its exchange ends, and is free
//! again for the client only when the server has answered it: when its
//! response has passed to the client (on the POST's own stream, even if the
//! server keeps the stream open; or, after that stream ended early, on a
//! `GET` that resumes it from the last event id the client saw on it, or on
//! any later resumption of that resumed stream), or
//! when a stand-in answer marked [`Unanswered::NotSent`](inner::Unanswered::NotSent) says
//! the request never reached the server. Any other ending leaves it
//! abandoned (see below), an answer the guard did not see the server give
//! included: a `4xx` or `5xx` built by a layer inside the guard (a timeout's
//! `408`, a body limit's `413`), or any response that is not the server's
//! JSON-RPC answer. Sequential reuse always works. Two ids collide when the server would route them to one
//! slot: `1`, `"1"` and `"\u0031"` are one id (the Python SDK routes by
//! `str(id)`). A request also collides with an earlier request of its own
//! batch. Under `Remap` only a live request the server knows by that very id
//! counts; under `Reject` and `Queue`, any live request with it.
//!
//! Under `Queue`, same-id requests of a session run one after another. A
//! batch containing a duplicate is refused as under `Reject` (holding a whole
//! batch for one member would delay its other requests behind unrelated
//! work). A queued request counts against the per-session cap, and one whose
//! client goes away leaves the queue.
//!
//! # What is tracked: fail closed
//! The guard is a security boundary, so it follows one rule: **a POST in a
//! tracked session whose body any real server could read as a JSON-RPC
//! request is either tracked under the id that server would see, or answered
//! by the guard itself, never forwarded untracked.**
//!
//! A session is tracked when the request carries one `Mcp-Session-Id`,
//! whatever `MCP-Protocol-Version` the request claims: a session exists only
//! in the revisions that have them (2026-07-28 has no `initialize` to start
//! one), and a server that speaks both revisions routes a POST carrying a
//! session id into that session by id. Requests without a session
//! (`initialize`, revision 2026-07-28, stateless servers) pass untouched.
//!
//! **The guard decides on the request the server will see.** A request in a
//! session whose `Connection` header names a header that the guard, the
//! metrics or the trace layer reads (the MCP headers, `Last-Event-ID`,
//! `Content-*`, `Transfer-Encoding`, `Accept`, `Accept-Encoding`, the trace
//! context, `Host`, `Origin`) is refused: every proxy on the way drops the
//! headers `Connection` names, so the server would read another request than
//! the layers did. The rule holds in every face alike, in process too. So
//! is a session id with a byte outside visible ASCII (the transport allows
//! 0x21 to 0x7E only): HTTP/2 keeps a space or tab at either end of a value,
//! which an HTTP/1.1 parser on the way strips, so the guard would track
//! another session than the one the server routes into.
//!
//! In a session:
//! - **every `POST` is read, whatever its `Content-Type`**: servers check it
//!   loosely (the Python SDK takes `application/json, text/plain`);
//! - its requests (objects with a string `method` and a non-null `id`, alone
//!   or in a batch) are tracked; notifications, client responses to server
//!   requests, `GET` and `DELETE` pass through untracked;
//! - **ids compare as the servers compare them**: strings by their decoded
//!   text (`"\u0031"` is `"1"`), numbers by value (`1`, `1.0`, `1e0` and
//!   `10e-1` are one id: rmcp reads them all as the integer 1), and an
//!   integer also equals the string of its digits (`1` and `"1"`: the Python
//!   SDK routes by `str(id)`);
//! - keys are read decoded (`"\u0069d"` is `id`) and **every top-level key of
//!   every message is read**, not only the first few, so a second `id` hidden
//!   after a large payload is seen;
//! - a UTF-8 byte order mark is dropped before the body is read and
//!   forwarded (the Python SDK skips one, serde refuses it);
//! - a body whose first byte (after whitespace) is not `{` or `[` is no
//!   JSON-RPC message to any server: it passes untracked, byte-identical,
//!   and the server answers it with its own error (form data, plain text, an
//!   empty body).
//!
//! Where servers would read a body differently, the guard refuses it (see the
//! answers below): a key twice in one message (Python and JavaScript keep the
//! last, serde refuses), an id that servers read differently (a string that
//! is not valid Unicode, an integer beyond ±(2^53 − 1), where JavaScript
//! merges neighbours, a fraction of more than 15 significant digits, `true`,
//! an object), UTF-16 or UTF-32 (RFC 8259 §8.1 requires UTF-8; the Python SDK
//! decodes them), a compressed body (Express's body parser inflates request
//! bodies, so the server would read what the guard cannot see), a body that
//! starts like JSON but cannot be followed (some
//! server's parser may still take it), and more than one `Mcp-Session-Id`
//! header. The guard reads only the structure of a body (its keys and its
//! ids), never the payload: a request whose `params` are broken is still
//! tracked, and the server answers it with its own error.
//!
//! A remapped request reaches the server with the id
//! `"mcp-id-guard:<mac>:<counter>:<original id JSON>"`, where `<mac>` is a
//! keyed MAC (SipHash-2-4) over the session, the counter and the original;
//! the top-level `id` of every JSON-RPC response carrying such an id is
//! replaced by the original, in `application/json` and `text/event-stream`
//! responses, on the POST's own stream and on `GET` streams (standalone or
//! resumed with `Last-Event-ID`), **only if this guard's secret issued it for
//! the session the response belongs to**. Another session's id, or one nobody
//! issued, goes on as the server wrote it (counted in
//! [`Stats::restore_refused_total`]): an upstream that leaks one session's
//! answer into another's is never dressed up as a correct answer. The id
//! carries everything needed, so restoring keeps no state, and guard
//! instances built with one [`IdGuardLayer::with_secret`] restore each other's ids. A
//! client id that already starts with `mcp-id-guard:` is itself remapped, so
//! restoring unwraps exactly one level. Nothing else in a message changes.
//!
//! Responses are restored as they stream: bytes go on as they arrive, and
//! only a response's `id` is held back (with at most 64 KiB after it) until
//! the message shows it is a response and has no second `id` (or a string
//! `method`) within that window, wherever the `id` sits (first in rmcp's and
//! Python's responses, last in the TypeScript SDK's), across SSE `data:`
//! lines and chunk boundaries. Memory per exchange does not grow with the size of the
//! response. A server message with two `id` keys within the window passes on
//! as it is and answers nothing (parsers disagree on which id counts). Every
//! SSE event's data is read, whatever its `event:` type: the type that counts
//! is the last `event:` line's, which may follow the data.
//!
//! # Abandoned ids
//! The server may still answer a request the client gave up on: a disconnect
//! is not a cancellation (spec 2025-06-18, transports), and a handler may
//! ignore a cancellation. A server that closes a request's stream to have the
//! client poll for the answer (SEP-1699) is still running it. An unguarded
//! server hands that late answer to the next request that reuses the id. So
//! when an exchange ends without its response (the stream ended or broke off
//! before it, the client disconnected or dropped the request, the inner
//! service failed, a panic, a stand-in answer marked [`Unanswered::Sent`](inner::Unanswered::Sent)),
//! and the server knew it by the client's own id, the id stays *abandoned* for
//! [`IdGuardLayer::abandoned_id_ttl`] (5 minutes): it is free for the client,
//! but a new request with it goes to the server with a server-side id, under
//! every policy (never refused or queued: the client did nothing wrong).
//!
//! # Memory
//! A client decides how long its session id and request ids are and how
//! many requests it abandons, so the guard bounds what it keeps for them:
//! - a session id longer than [`IdGuardLayer::max_session_id_bytes`] (8 KiB:
//!   UUIDs, hex tokens and encrypted gateway ids fit) is refused,
//!   whatever the request;
//! - everything the session table holds (in-flight and queued requests,
//!   abandoned ids, sessions seen starting, each with its collision key,
//!   session id and server-side id) is charged against one byte budget,
//!   [`IdGuardLayer::max_table_bytes`] (64 MiB), as an estimate within a
//!   small factor of the allocator's count ([`Stats::table_bytes`]). A
//!   request that does not fit first makes the table forget its oldest
//!   abandoned ids (a late answer to one of those could then reach a reuse of
//!   its id: size the budget for your traffic); if it still does not fit, the
//!   guard answers it with `503`. Besides the budget, at most 65 536
//!   abandoned ids are kept, also oldest first.
//!
//! # After a restart
//! A guard that restarts while the server keeps running has lost its table;
//! for [`IdGuardLayer::restart_window`] (off by default; the reverse proxy
//! sets it) it sends every request of a session it did not see start with a
//! server-side id. Why, and what it reads to tell, is said there.
//!
//! # Cancellation
//! A `notifications/cancelled` whose `params.requestId` names a request in
//! flight in the session goes to the live request the server knows by the
//! client's own id (at most one is live at a time: exactly the request an
//! unguarded server would have cancelled), or, when there is none, to the
//! oldest live remapped one; only when no live request has the id, to an
//! abandoned one the server knows by it. `requestId` is rewritten to the id the server knows the
//! request by: its server-side id, or the client's id as it was sent (so `"1"`
//! cancels a request sent as `1` on servers that compare ids by type). The id
//! is free for the client at once, and abandoned as above. A `requestId` that
//! matches nothing passes unchanged; a cancellation never affects another
//! session. In a batch, each cancellation is handled on its own, after the
//! batch's requests were admitted; a batch the guard refuses cancels nothing.
//!
//! # Replicas
//! With [`IdGuardLayer::rewrite_all_ids`] every tracked request gets a
//! server-side id, colliding or not: the server never sees an id twice in a
//! session, and several guard instances in front of one server cannot collide
//! without sharing state (each instance counts from a random point of its
//! own).
//!
//! # Answers the guard gives itself
//! | case | status | JSON-RPC error |
//! |---|---|---|
//! | duplicate under `Reject` | `reject_status` (400) | `-32600`, the offending `id` |
//! | batch with a duplicate under `Reject` or `Queue` | `reject_status` | an array: one error per request of the batch, each with its `id` |
//! | body over `max_body_bytes` | 413 | `-32600`, `id: null` |
//! | session at `max_in_flight_per_session` | 429 | `-32000`, the request's `id` (an array for a batch) |
//! | tracked request that does not fit in `max_table_bytes` | 503 | `-32000`, the request's `id` (an array for a batch) |
//! | `Mcp-Session-Id` longer than `max_session_id_bytes` (any method) | 400 | `-32600`, the request's `id` (an array for a batch); `null` when the guard does not read the body or it holds no request |
//! | waited longer than `max_queue_wait` under `Queue` | 503 | `-32000`, the request's `id` |
//! | tracked body failed while being read | 400 | `-32600`, `id: null` |
//! | body starts with `{` or `[` but is not JSON the guard can follow | 400 | `-32700`, `id: null` |
//! | UTF-16 or UTF-32 body | 415 | `-32700`, `id: null` |
//! | a compressed body (`Content-Encoding` other than `identity`) | 415 | `-32600`, `id: null` |
//! | a key twice in one message (or in a cancellation's `params`) | 400 | `-32600`, `id: null` |
//! | a request or cancellation id that servers read differently | 400 | `-32600`, `id: null` |
//! | more than one `Mcp-Session-Id` header on a POST | 400 | `-32600`, `id: null` |
//! | in a session, a `Connection` header naming a header a layer reads (any method) | 400 | `-32600`, `id: null` |
//! | an `Mcp-Session-Id` with a byte outside visible ASCII (0x21 to 0x7E; any method) | 400 | `-32600`, `id: null` |
//!
//! # Where to put other layers
//! `examples/full_stack.rs` is the stack this section is written from
//! (tower-http 0.6 layers over axum 0.8 and rmcp 3.11), and
//! `tests/rmcp/full_stack.rs` checks each claim below on that very stack.
//! From the outside in:
//!
//! ```text
//! TraceLayer > ResponseBodyTimeoutLayer > CompressionLayer (SSE included) > CorsLayer
//!   > TimeoutLayer > ProtectLayer (HeadLimitLayer > HostLayer > BodyPaceLayer) > IdGuardLayer
//!   > MCP service
//! ```
//!
//! - **Outside the guard: every layer that may answer in the server's
//!   place** (timeouts, body limits, concurrency and rate limits,
//!   authentication, CORS), as well as tracing and compression. The guard frees an
//!   id only when the server's JSON-RPC answer to it has passed to the client,
//!   or on a stand-in marked [`Unanswered::NotSent`](inner::Unanswered::NotSent). An answer it did not see
//!   the server give (a `408` from a timeout inside it, a `413` from a body
//!   limit inside it, any response a layer inside it builds) leaves the id
//!   abandoned, since the server may already run the request: the next
//!   request reusing the id is remapped. A layer inside the guard is safe, but
//!   each answer it gives costs an abandoned id for
//!   [`IdGuardLayer::abandoned_id_ttl`]. And a request waiting under `Queue`
//!   keeps the inner service that `poll_ready` readied for it, so a
//!   concurrency limit inside the guard would hold a permit while it waits.
//! - **A slow tool is cut by tower-http's `ResponseBodyTimeoutLayer`, not by
//!   its `TimeoutLayer`.** rmcp answers every POST of a session as SSE, with
//!   the headers (and a priming event) at once, so `TimeoutLayer`, which
//!   times the response headers, never fires on a slow tool.
//!   `ResponseBodyTimeoutLayer` ends the stream after a silence: the client
//!   gets no answer, the guard sees the stream end without one and leaves the
//!   id abandoned (the server still runs the tool), and a reuse of the id is
//!   remapped and gets its own answer. It times a *silence*, not a total:
//!   every frame restarts it, rmcp's SSE keep-alive comments included (every
//!   15 s by default, `StreamableHttpServerConfig::with_sse_keep_alive`), so
//!   it cuts nothing unless it is shorter than the keep-alive interval. It must
//!   sit outside `CorsLayer` and `TimeoutLayer`, which build responses with
//!   `Default`: its `TimeoutBody` has none, and the stack does not build
//!   (`TimeoutBody<…>: Default` is not satisfied).
//! - **Under `OnDuplicate::Queue`, keep [`IdGuardLayer::max_queue_wait`]
//!   below any outer `TimeoutLayer`.** A queued request waits in the guard's
//!   response future, before any header exists, so a shorter `TimeoutLayer`
//!   answers it with a bare `408`: no body, no JSON-RPC error, no id. With
//!   `max_queue_wait` below it, the client gets the guard's `503` and a
//!   `-32000` error carrying its id.
//! - **Body limits: set [`IdGuardLayer::max_body_bytes`]** (`413` and a
//!   `-32600` error). tower-http's `RequestBodyLimitLayer` outside the guard
//!   refuses a body whose `Content-Length` is over the limit with a
//!   plain-text `413` (`length limit exceeded`) before the guard reads it,
//!   while a chunked body over it fails the guard's read: `400`, `-32600`,
//!   `id: null`. Inside the guard, a `Content-Length` body gets the same
//!   plain-text `413` (the guard forwards the length), and so does a chunked
//!   one the guard remapped (a rewritten body goes on with a
//!   `Content-Length`); a chunked one passed with its own id fails rmcp's
//!   own read: `500` with the text `Failed to read request body: length
//!   limit exceeded` (no `Content-Type`, no JSON-RPC error). Each leaves the
//!   id abandoned.
//! - **Compression goes outside the guard, told to compress SSE.** The guard
//!   restores ids in the server's uncompressed bytes and drops
//!   `Accept-Encoding` on every request whose response it reads, so a
//!   `CompressionLayer` inside it compresses nothing. Outside, tower-http's
//!   default predicate skips `text/event-stream`, which is every answer rmcp
//!   gives in a session, so it compresses nothing either unless its predicate
//!   leaves SSE in (`SizeAbove::default().and(NotForContentType::GRPC)
//!   .and(NotForContentType::IMAGES)`). Compressed SSE still streams: the
//!   encoder flushes whenever the server pauses, so each event reaches the
//!   client when it is sent.
//! - **CORS goes outside [`protect::host::HostLayer`], allowing only origins it
//!   allows.** `CorsLayer` answers a preflight (`OPTIONS`) itself, `200`,
//!   whatever the origin, and the POST that follows meets `HostLayer`, which
//!   refuses a foreign `Origin` with `403`. Safe, but a browser then sees the
//!   preflight pass and the POST fail.
//! - The network protections of [`protect`] go outside the guard, cheapest
//!   first, so a request they refuse is never read. Their bodies and
//!   [`guard::GuardResponseBody`] implement `Default`, which `TimeoutLayer` and
//!   `CorsLayer` outside them need.
//!
//! # Testing
//! The guard is a `tower::Service`: drive it with `ServiceExt::oneshot`, or
//! put a `tower-test` mock inside it. It reads a tracked POST's body in its
//! response future, so the inner service is called only once that future
//! is polled; [`inner`](inner#testing-with-tower-test) shows a whole test,
//! with the mock's request type [`inner::InnerRequest`].
//! [`IdGuardLayer::stats`] says what it did, and
//! [`inner::ServerSideId::parse`] tells a remapped id apart where the
//! server sees it. A running server, bare or guarded, is checked over HTTP
//! by `mcp-id-guard probe URL` (the binary, feature `cli`).
//!
//! # Feature flags
//! | feature | what it adds |
//! |---|---|
//! | *(none)* | [`IdGuardLayer`] and [`IdGuard`]: the Tower middleware; the network protections ([`protect`]); Prometheus metrics ([`protect::metrics`], through `prometheus-client`: no feature needed) |
//! | `proxy` | [`proxy::Proxy`]: a forwarding service to put the guard in front of an upstream MCP server in any language (hyper client) |
//! | `server` | [`server::Server`]: the connection-level protections (head, keep-alive and send timeouts, request and reset budgets per connection, connection cap, graceful shutdown) around any tower service |
//! | `cli` | the `mcp-id-guard` reverse-proxy binary (implies `proxy` and `server`) |
//! | `metrics` | [`Stats::record`]: publish the guard's counters and gauges through the [`metrics`](https://docs.rs/metrics) facade crate, to the exporter your application installed. Not for Prometheus, which needs no feature ([`protect::metrics`]) |
//! | `otel` | [`trace`]: OpenTelemetry traces through `tracing`, one span per JSON-RPC message, W3C `traceparent` continued and propagated (enabled by `cli`) |
//! | `internals` | building blocks for the crate's own benchmarks and fuzz targets; not public API |
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs link to the modules and methods behind features (`proxy`,
// `server`, `trace`, `Stats::record`): docs.rs builds them with every
// feature, where each link resolves. A build with fewer features renders
// those links as plain text rather than warn about what it left out.
#![cfg_attr(
    not(all(
        feature = "proxy",
        feature = "server",
        feature = "otel",
        feature = "metrics"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(unreachable_pub)]

/// `get_ref`, `get_mut` and `into_inner` for a service whose inner service
/// is its field `inner`, as tower's middleware has them.
macro_rules! inner_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// The inner service, unwrapped.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}

pub mod core;
pub mod exchange;
pub mod guard;
pub mod inner;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;
mod metric_names;
pub mod protect;
mod table;
mod throttle;
mod wire;

// The crate root holds what every user names; the rest lives in modules
// named for what it is (`exchange`, `guard`, `inner`, `protect`, ...), each
// item at one public path.
pub use guard::layer::IdGuardLayer;
pub use guard::service::IdGuard;
pub use table::{OnDuplicate, Stats};

#[cfg(feature = "proxy")]
#[cfg_attr(docsrs, doc(cfg(feature = "proxy")))]
pub mod proxy;

#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;

#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod trace;

#[cfg(test)]
mod tests {
    /// README's quick start is `examples/quickstart.rs` verbatim (the crate
    /// docs include the file itself), so the two cannot drift apart.
    #[test]
    fn readme_quick_start_is_the_example() {
        let readme = include_str!("../README.md");
        let example = include_str!("../examples/quickstart.rs");
        assert!(
            readme.contains(&format!("```rust,ignore\n{example}```")),
            "README.md's quick start differs from examples/quickstart.rs"
        );
    }

    /// README's placement snippet ("Where to put other layers") is the part
    /// of `examples/full_stack.rs` between its markers, imports included,
    /// so what the README shows is what CI compiles and
    /// `tests/rmcp/full_stack.rs` runs.
    #[test]
    fn readme_placement_snippet_is_the_example() {
        let readme = include_str!("../README.md");
        let example = include_str!("../examples/full_stack.rs");
        let start = "// layers\"); src/lib.rs's tests check that it is this text.\n";
        let end = "// README.md's copy ends here.\n";
        let from = example.find(start).expect("start marker") + start.len();
        let to = example.find(end).expect("end marker");
        let snippet = &example[from..to];
        assert!(snippet.contains("use tower_http::compression::predicate::"));
        assert!(
            readme.contains(&format!("```rust,ignore\n{snippet}```")),
            "README.md's placement snippet differs from examples/full_stack.rs"
        );
    }
}
