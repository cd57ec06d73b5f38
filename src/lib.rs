//! Tower middleware that stops MCP servers from delivering one caller's
//! response to another.
//!
//! # The problem
//! In the stateful streamable-HTTP transport of MCP (protocol revisions
//! 2025-03-26 to 2025-11-25), a server routes each response back to the POST
//! that asked for it by JSON-RPC request id alone. When two POSTs in one
//! `Mcp-Session-Id` carry the same id at the same time, the later one receives
//! the earlier one's result, its own result is dropped, and the earlier one
//! hangs. The spec forbids reusing an id in flight, but widely used clients send
//! every request with `id: 1` and share one session across conversations.
//!
//! # The fix
//! [`IdGuardLayer`] wraps any HTTP service (an rmcp `StreamableHttpService`, an
//! axum `Router`, a reverse proxy). It reads tracked POST bodies, registers each
//! request's id in its session before calling the inner service, and on a
//! duplicate either remaps it ([`OnDuplicate::Remap`], the default: the inner
//! server sees a unique id and the client's id is restored in the response) or
//! rejects it ([`OnDuplicate::Reject`]: HTTP 400 and JSON-RPC `-32600` carrying
//! the id), or queues it until the earlier request with that id has ended
//! ([`OnDuplicate::Queue`]). An id is free again for the client as soon as its
//! exchange ends, however it ends (under `Reject` and `Queue`, as soon as the
//! response event has passed, even if the server keeps the stream open).
//!
//! ```
//! use mcp_id_guard::{IdGuardLayer, OnDuplicate};
//! # async fn mcp(_: axum::extract::Request) -> &'static str { "" }
//!
//! let guard = IdGuardLayer::new(); // OnDuplicate::Remap
//! let app: axum::Router = axum::Router::new()
//!     .route("/mcp", axum::routing::any(mcp))
//!     .layer(guard.clone());
//! assert_eq!(guard.stats().in_flight_requests, 0);
//! ```
//!
//! # What is tracked
//! A `POST` with `Content-Type: application/json` (parameters and case
//! ignored), an `Mcp-Session-Id` header, no `MCP-Protocol-Version` of
//! 2026-07-28 or later (that revision has no sessions), and a body that is a
//! JSON-RPC request (an object with a string `method` and a non-null `id`) or a
//! batch containing requests. Everything else passes through byte-identical and
//! untracked: `initialize` (no session yet), notifications, client responses to
//! server requests, GET and DELETE, other content types, bodies that are not
//! JSON (the inner server reports its own parse error).
//!
//! # What the guard reads
//! Only a message's envelope: its top-level keys, from the front up to the
//! first object or array value (`params`, `result`) and, when that does not
//! settle the message, from the back. So it finds `id` without reading the
//! payload, at any body size, whether a library writes `id` first (rmcp,
//! the Python SDK's responses) or last (the TypeScript SDK). The payload is
//! not validated: a body whose envelope reads as a request is tracked even if
//! its `params` are broken, and the server answers it with its own parse
//! error. Bodies the envelope does not settle (an escaped key, a
//! notification with a payload, `notifications/cancelled`, a client's
//! response, a batch) are parsed whole; if that fails they pass untracked. A
//! duplicated envelope key (`id`, `method`, `params`, `result`, `error`) seen
//! either way makes a body unreadable, so it passes untracked, but one
//! hidden inside the unread middle of a body is not seen: only the client
//! that wrote such a body can be confused by it. From the inner server, an
//! `id` with a `result` or `error` read before any `method` is a response.
//!
//! # When ids collide
//! Ids collide when their decoded values are equal, and an integer `n` also
//! collides with the string `"n"` (the Python SDK routes by `str(id)`): `1`,
//! `"1"` and `"\u0031"` are one id. `-0` is `0`; an id that is neither a string
//! nor an integer is compared by its exact JSON text. A request collides with
//! an earlier request of its own batch, and with a request of its session still
//! in flight with the same id: under `Remap`, one the server knows by that id
//! (later duplicates are remapped anyway); under `Reject` and `Queue`, any.
//! Sequential reuse is always allowed.
//!
//! # Remapped ids
//! A remapped request goes to the inner service with the id
//! `"mcp-id-guard:<instance tag>:<counter>:<original id JSON>"`. The top-level
//! `id` of every JSON-RPC response (an object with `result` or `error`) that
//! carries such an id is replaced by the original, byte for byte, in
//! `application/json` and `text/event-stream` responses; nothing else in the
//! response changes. A client id that already starts with `mcp-id-guard:` is
//! always remapped, so restoring unwraps exactly one level.
//!
//! Responses replayed on a resumed `GET` stream (`Last-Event-ID`) or delivered
//! on the standalone `GET` stream are restored the same way: the id carries
//! everything needed, so no state is kept and any guard instance can restore
//! any other's ids. Event runs that do not contain the prefix are not parsed.
//!
//! With [`IdGuardLayer::rewrite_all_ids`] every tracked request gets a
//! server-side id, colliding or not: the server never sees an id twice in a
//! session, and several guard replicas in front of one server cannot collide
//! without sharing state.
//!
//! # Abandoned requests
//! The server may still answer a request the client gave up on: a disconnect
//! is not a cancellation (spec 2025-06-18, transports), and a handler may
//! ignore a cancellation. An unguarded server hands that late answer to the
//! next request that reuses the id. So when an exchange ends before its
//! response (the client disconnected or dropped the request, the inner
//! service failed, a panic) or was cancelled, and the server knew it by the
//! client's own id, the id stays *abandoned* for
//! [`IdGuardLayer::abandoned_id_ttl`] (5 minutes): it is free for the client,
//! but a new request with it goes to the server with a server-side id, under
//! every policy (never refused or queued: the client did nothing wrong).
//!
//! # Cancellation
//! A `notifications/cancelled` whose `params.requestId` names a request in
//! flight in the session goes to the request the server knows by the client's
//! own id (at most one is live at a time: exactly the request an unguarded
//! server would have cancelled), or, when there is none, to the oldest
//! remapped one. `requestId` is rewritten to the id the server knows the
//! request by: its server-side id, or the client's id as it was sent (so `"1"`
//! cancels a request sent as `1` on servers that compare ids by type). The id
//! is free for the client at once, and abandoned as above. A `requestId` that
//! matches nothing passes unchanged; a cancellation never affects another
//! session. In a batch, each cancellation is handled on its own, after the
//! batch's requests were admitted; a batch the guard refuses cancels nothing.
//!
//! # Queueing
//! Under [`OnDuplicate::Queue`] a duplicate waits, first come first served per
//! session and id, until the earlier request's exchange ends, and then goes to
//! the inner service with its own id. Same-id requests of a session therefore
//! run one after another: each waits for the whole previous exchange. The wait
//! is bounded by [`IdGuardLayer::max_queue_wait`] (30 s; then `503` and
//! `-32000`), queued requests count against the per-session cap, and a request
//! whose client goes away leaves the queue. A batch containing a duplicate is
//! refused as under `Reject`: holding a whole batch for one member would delay
//! its other requests behind unrelated work. A waiting request keeps the inner
//! service that `poll_ready` readied for it, so behind a concurrency limit
//! (tower's `ConcurrencyLimit`) it holds a permit while it waits; put such
//! limits outside the guard.
//!
//! # Answers the guard gives itself
//! | case | status | JSON-RPC error |
//! |---|---|---|
//! | duplicate under `Reject` | `reject_status` (400) | `-32600`, the offending `id` |
//! | batch with a duplicate under `Reject` | `reject_status` | an array: one error per request of the batch, each with its `id` |
//! | body over `max_body_bytes` | 413 | `-32600`, `id: null` |
//! | session at `max_in_flight_per_session` | 429 | `-32000`, the request's `id` (an array for a batch) |
//! | waited longer than `max_queue_wait` under `Queue` | 503 | `-32000`, the request's `id` |
//! | tracked body failed while being read | 400 | `-32600`, `id: null` |
//!
//! The guard reads tracked bodies itself, so a body limit outside it (such as
//! tower-http's `RequestBodyLimitLayer`) surfaces as a failed read: `400`, not
//! `413`. Set [`IdGuardLayer::max_body_bytes`] to the limit you want, or put
//! such layers inside the guard.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(unreachable_pub)]

mod body;
mod config;
mod edit;
mod envelope;
mod future;
mod id;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;
mod layer;
mod prepare;
mod protocol;
mod reply;
mod restore;
mod service;
mod sse;
mod stats;
mod table;

pub use body::{RequestBody, ResponseBody};
pub use config::OnDuplicate;
pub use future::ResponseFuture;
pub use layer::IdGuardLayer;
pub use service::IdGuard;
pub use stats::Stats;

#[cfg(feature = "proxy")]
#[cfg_attr(docsrs, doc(cfg(feature = "proxy")))]
pub mod proxy;
