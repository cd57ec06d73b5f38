//! The command line: every flag, with its environment variable, default and
//! why.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};

mod values;

pub(crate) use values::{parse_duration, parse_reject_status, read_id_secret};

/// Guards an MCP streamable-HTTP server against concurrent requests that
/// reuse a JSON-RPC id in one session: a reverse proxy that gives every
/// duplicate a unique id (or rejects it) and streams everything else through.
///
/// To run the server too, put its command after `--`: `mcp-id-guard
/// --upstream-port 3000 -- node server.js` starts it with PORT=3000, serves
/// once it listens on 127.0.0.1:3000, and stops with it.
///
/// Point MCP clients at http://<listen>/<the server's path>. Logs go to
/// stderr; set RUST_LOG (e.g. RUST_LOG=debug) to change how much is logged.
///
/// Is a server affected? `mcp-id-guard probe URL` checks one, bare or behind
/// this proxy (see `mcp-id-guard probe --help`).
///
/// OpenTelemetry traces (one span per JSON-RPC message, continuing the
/// client's traceparent) go to an OTLP collector when
/// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
/// set, over OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf (the default) or
/// grpc; https:// endpoints are verified against the system's roots, or
/// OTEL_EXPORTER_OTLP_CERTIFICATE (a PEM file). Also read:
/// OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT,
/// OTEL_EXPORTER_OTLP_COMPRESSION (gzip), OTEL_SERVICE_NAME,
/// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG),
/// OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
/// OTEL_BSP_SCHEDULE_DELAY, OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER (otlp
/// or none).
#[derive(Debug, Parser)]
#[command(name = "mcp-id-guard", version)]
// The upstream: a URL, or a loopback port (where COMMAND listens).
#[command(group(
    ArgGroup::new("upstream_address")
        .required(true)
        .args(["upstream", "upstream_port"])
))]
pub(crate) struct Args {
    /// Address to listen on.
    #[arg(long, env = "MCP_ID_GUARD_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,

    /// Base URL of the MCP server to protect, such as http://127.0.0.1:8000.
    /// A request for /mcp?x=1 goes to <upstream>/mcp?x=1.
    #[arg(long, env = "MCP_ID_GUARD_UPSTREAM")]
    pub(crate) upstream: Option<String>,

    /// The upstream is http://127.0.0.1:N: the server the proxy starts
    /// (COMMAND after `--`), or one already running there.
    #[arg(
        long,
        env = "MCP_ID_GUARD_UPSTREAM_PORT",
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub(crate) upstream_port: Option<u16>,

    /// With a COMMAND: how long it may take to accept connections on
    /// 127.0.0.1:<--upstream-port>; then the proxy stops it and exits.
    #[arg(
        long,
        env = "MCP_ID_GUARD_UPSTREAM_START_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub(crate) upstream_start_timeout: Duration,

    /// The MCP server to run and protect, after `--` (e.g. `-- node
    /// server.js`), with the proxy's environment plus PORT=<--upstream-port>
    /// (many servers read PORT; others need the port in their own
    /// arguments). It should listen on 127.0.0.1 (or on every address). The
    /// proxy serves once it accepts connections; SIGINT/SIGTERM are passed on
    /// to it, and the proxy exits with its exit code (128+N for signal N),
    /// after at most 10s (then it is killed). If it exits by itself, the
    /// proxy stops too.
    #[arg(
        last = true,
        value_name = "COMMAND",
        requires = "upstream_port",
        conflicts_with = "upstream",
        num_args = 1..
    )]
    pub(crate) command: Vec<String>,

    /// What to do with a request whose id is already in flight in its
    /// session: give it a unique id and restore the client's in the response
    /// (remap), answer it with an error (reject), or hold it until the earlier
    /// request with that id has ended (queue).
    #[arg(
        long,
        env = "MCP_ID_GUARD_ON_DUPLICATE",
        value_enum,
        default_value_t = Policy::Remap
    )]
    pub(crate) on_duplicate: Policy,

    /// HTTP status of rejections under --on-duplicate reject: any 4xx code,
    /// such as 400 (as the Go SDK answers) or 409.
    #[arg(
        long,
        env = "MCP_ID_GUARD_REJECT_STATUS",
        default_value = "400",
        value_parser = parse_reject_status
    )]
    pub(crate) reject_status: http::StatusCode,

    /// Under --on-duplicate queue, how long a request may wait before it
    /// gets 503 (e.g. 30s).
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_QUEUE_WAIT",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub(crate) max_queue_wait: Duration,

    /// Give every tracked request a unique server-side id, not only
    /// duplicates: the server never sees an id twice in a session, even after
    /// a client went away while its request was still running there.
    #[arg(long, env = "MCP_ID_GUARD_REWRITE_ALL_IDS")]
    pub(crate) rewrite_all_ids: bool,

    /// A file holding the secret (32 hex digits: 16 bytes) that binds each
    /// server-side id to its session: only an id this secret issued for the
    /// response's session is restored. Give every replica behind one load
    /// balancer the same file, so a stream resumed on another replica is
    /// restored too. Default: a random secret per process.
    #[arg(long, env = "MCP_ID_GUARD_ID_SECRET_FILE", value_name = "PATH")]
    pub(crate) id_secret_file: Option<std::path::PathBuf>,

    /// How long the id of a request its client gave up on (disconnected,
    /// cancelled) stays shadowed, so the server's late answer cannot reach a
    /// new request with that id (e.g. 5m; 0 turns shadowing off). Pick a
    /// value above your longest tool call.
    #[arg(
        long,
        env = "MCP_ID_GUARD_ABANDONED_ID_TTL",
        default_value = "5m",
        value_parser = parse_duration
    )]
    pub(crate) abandoned_id_ttl: Duration,

    /// For this long after start, requests of sessions whose `initialize`
    /// answer this process did not see go with server-side ids, so a late
    /// answer to a request cut by a restart of the proxy cannot reach a new
    /// request reusing its id (e.g. 5m; 0 turns it off). Default: the
    /// --abandoned-id-ttl.
    #[arg(long, env = "MCP_ID_GUARD_RESTART_WINDOW", value_parser = parse_duration)]
    pub(crate) restart_window: Option<Duration>,

    /// Longest Mcp-Session-Id the guard accepts; requests in a session with
    /// a longer one get 400 and never reach the upstream.
    #[arg(long, env = "MCP_ID_GUARD_MAX_SESSION_ID_BYTES", default_value_t = 8 * 1024)]
    pub(crate) max_session_id_bytes: usize,

    /// Bytes the guard's session table may hold (in-flight requests,
    /// abandoned ids, with their ids and session ids). When full, the oldest
    /// abandoned ids are forgotten first; a request that still does not fit
    /// gets 503.
    #[arg(long, env = "MCP_ID_GUARD_MAX_TABLE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub(crate) max_table_bytes: usize,

    /// Largest request body, tracked or not; larger ones get 413. Every
    /// body is read whole (and counted against --max-body-memory-bytes)
    /// before the request goes upstream, as nginx buffers request bodies, so
    /// a body that trickles holds no upstream connection.
    #[arg(long, env = "MCP_ID_GUARD_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub(crate) max_body_bytes: usize,

    /// Bytes of request bodies the proxy may hold at once, across all
    /// connections (like --max-table-bytes for the session table): a body is
    /// charged for the bytes that have arrived of it (never for its
    /// Content-Length), from its first byte until the upstream's response
    /// head, and gets 503 when it outgrows what is left. An eighth is kept
    /// for bodies of at most 64 KiB, which larger ones cannot take.
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_BODY_MEMORY_BYTES",
        default_value_t = mcp_id_guard::protect::buffer::BodyBudget::DEFAULT_MAX_BYTES
    )]
    pub(crate) max_body_memory_bytes: usize,

    /// Bytes of request bodies one client connection may hold at once (the
    /// streams of an HTTP/2 connection count together, as Envoy bounds
    /// buffering per connection); past it, 503. Default: --max-body-bytes,
    /// so one body of the largest size fits.
    #[arg(long, env = "MCP_ID_GUARD_MAX_BODY_MEMORY_PER_CONNECTION")]
    pub(crate) max_body_memory_per_connection: Option<usize>,

    /// Bytes the request bodies over 64 KiB of one client address may hold
    /// at once, across its connections; past it, 503. Smaller bodies do not
    /// count (they draw on the part of --max-body-memory-bytes kept for
    /// them). Behind a TLS terminator or a balancer every client has its
    /// address: set it to --max-body-memory-bytes there. Default: half of
    /// --max-body-memory-bytes.
    #[arg(long, env = "MCP_ID_GUARD_MAX_BODY_MEMORY_PER_CLIENT")]
    pub(crate) max_body_memory_per_client: Option<usize>,

    /// Requests one session may have in flight; more get 429.
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_IN_FLIGHT_PER_SESSION",
        default_value_t = 1024,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_in_flight_per_session: u32,

    /// How long to wait for the upstream to accept a connection before
    /// answering 502 (e.g. 5s, 500ms).
    #[arg(
        long,
        env = "MCP_ID_GUARD_CONNECT_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub(crate) connect_timeout: Duration,

    /// Host names clients may use to reach the proxy (comma-separated):
    /// `name` or `name:*` for any port, `name:port`, IPv6 in brackets. A
    /// request naming another host (in `Host` or HTTP/2 `:authority`) gets
    /// 421: this is DNS-rebinding protection. Replaces the default, which on
    /// a loopback --listen address is localhost, 127.0.0.1 and [::1] on any
    /// port; on any other address, name the hosts or pass --allow-any-host.
    #[arg(
        long,
        env = "MCP_ID_GUARD_ALLOWED_HOSTS",
        value_delimiter = ',',
        conflicts_with = "allow_any_host"
    )]
    pub(crate) allowed_hosts: Vec<String>,

    /// Serve requests whatever host they name (no Host check), e.g. behind a
    /// load balancer that checks it.
    #[arg(long, env = "MCP_ID_GUARD_ALLOW_ANY_HOST")]
    pub(crate) allow_any_host: bool,

    /// Browser origins allowed to call the proxy (comma-separated):
    /// `scheme://host`, `scheme://host:port`, `scheme://host:*`, or `null`.
    /// Requests without Origin (from programs, not browsers) always pass; an
    /// origin not listed gets 403. Default: http/https origins on localhost,
    /// 127.0.0.1 and [::1] (any port).
    #[arg(
        long,
        env = "MCP_ID_GUARD_ALLOWED_ORIGINS",
        value_delimiter = ',',
        conflicts_with = "allow_any_origin"
    )]
    pub(crate) allowed_origins: Vec<String>,

    /// Serve requests whatever their Origin (no Origin check).
    #[arg(long, env = "MCP_ID_GUARD_ALLOW_ANY_ORIGIN")]
    pub(crate) allow_any_origin: bool,

    /// Forward the client's Host to the upstream unchanged (instead of the
    /// upstream's own address), so the upstream's own Host check still sees
    /// it. The upstream must then accept the names clients use.
    #[arg(long, env = "MCP_ID_GUARD_PRESERVE_HOST")]
    pub(crate) preserve_host: bool,

    /// Trust the forwarding headers requests arrive with: X-Forwarded-Host,
    /// X-Forwarded-Proto and Forwarded pass unchanged and the client's
    /// address is appended to X-Forwarded-For (nginx's
    /// $proxy_add_x_forwarded_for). Only behind a proxy that sets them (a
    /// TLS terminator, a load balancer). Default: the proxy is the first
    /// hop the upstream can believe (Envoy's use_remote_address):
    /// X-Forwarded-For is the client's address alone, X-Forwarded-Host the
    /// Host it sent, X-Forwarded-Proto http, and Forwarded is dropped.
    #[arg(long, env = "MCP_ID_GUARD_TRUST_FORWARDED")]
    pub(crate) trust_forwarded: bool,

    /// How long a client may take to send a whole request head, from when
    /// it connects (protocol detection and the HTTP/2 preface included) or
    /// sends the first byte of a later request. Slow-header clients hold a
    /// connection each; legitimate ones send a head in milliseconds. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_HEADER_READ_TIMEOUT",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub(crate) header_read_timeout: Duration,

    /// Longest pause in a request body while the proxy waits for it; then
    /// the request fails and the connection closes. MCP POST bodies are
    /// small and sent at once. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_REQUEST_BODY_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub(crate) request_body_timeout: Duration,

    /// Slowest rate a request body may arrive at, in bytes per second of
    /// waiting for it, once --request-body-grace has passed (like Kestrel's
    /// 240 B/s); a slower body gets 408 and the connection closes. Cuts a
    /// body that trickles a byte just often enough to stay under
    /// --request-body-timeout. Judged over a window: data earns waiting at
    /// this rate, but at most one --request-body-timeout of it, so a burst
    /// earns no hours of pauses. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_MIN_REQUEST_BODY_RATE",
        default_value_t = 240
    )]
    pub(crate) min_request_body_rate: u64,

    /// How long a request body may arrive at any rate before
    /// --min-request-body-rate applies.
    #[arg(
        long,
        env = "MCP_ID_GUARD_REQUEST_BODY_GRACE",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub(crate) request_body_grace: Duration,

    /// How long a write to a client may stay blocked because the client does
    /// not read (nginx's send_timeout); then the connection is dropped,
    /// with the upstream request it holds. A slow-reading client would
    /// otherwise keep an upstream connection busy for ever. As for nginx, a
    /// write blocks only once the kernel's send buffer for the client (up
    /// to a few MiB) is full: a slow stream fills it first. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_SEND_TIMEOUT",
        default_value = "60s",
        value_parser = parse_duration
    )]
    pub(crate) send_timeout: Duration,

    /// How long a connection may stay open with no request in progress. As
    /// nginx's default, and above the idle timeouts of common load balancers
    /// in front (60s), so they close first. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_KEEP_ALIVE_TIMEOUT",
        default_value = "75s",
        value_parser = parse_duration
    )]
    pub(crate) keep_alive_timeout: Duration,

    /// How long the upstream may take to send response headers; then the
    /// client gets 504 with a JSON-RPC error carrying its id. Streaming
    /// (SSE) servers send headers at once; servers answering with plain JSON
    /// send them when the tool finishes: set it above your longest tool
    /// call. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_UPSTREAM_RESPONSE_TIMEOUT",
        default_value = "5m",
        value_parser = parse_duration
    )]
    pub(crate) upstream_response_timeout: Duration,

    /// Longest pause in an upstream response body (SSE stream) before the
    /// client's response is cut. SSE keep-alive comments count as activity
    /// (rmcp and python-sdk send one every 15s), so healthy streams stay
    /// open; clients reconnect cut GET streams. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_UPSTREAM_IDLE_TIMEOUT",
        default_value = "5m",
        value_parser = parse_duration
    )]
    pub(crate) upstream_idle_timeout: Duration,

    /// Most client connections open at once. At the cap, the connection
    /// idle the longest (no request in progress) closes gracefully for each
    /// new one, as nginx closes idle keep-alive connections when it runs
    /// out; while none is idle, new ones wait until one closes. Default:
    /// half the descriptor limit (ulimit -n) after a reserve, so client and
    /// upstream connections fit.
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_CONNECTIONS",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_connections: Option<u32>,

    /// Most upstream connections open at once, idle pooled ones included
    /// (each open SSE stream holds one); requests that find none free wait
    /// up to --upstream-queue-timeout, then get 503. Default: 1024 (envoy's
    /// default), or less when the descriptor limit leaves less room.
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_UPSTREAM_CONNECTIONS",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_upstream_connections: Option<u32>,

    /// How long a request waits for a free upstream connection before it
    /// gets 503 with a JSON-RPC error carrying its id.
    #[arg(
        long,
        env = "MCP_ID_GUARD_UPSTREAM_QUEUE_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub(crate) upstream_queue_timeout: Duration,

    /// How long an idle upstream connection stays pooled: below the 5s
    /// keep-alive of uvicorn and Node's HTTP server, so the proxy closes idle
    /// connections before the upstream does.
    #[arg(
        long,
        env = "MCP_ID_GUARD_POOL_IDLE_TIMEOUT",
        default_value = "4s",
        value_parser = parse_duration
    )]
    pub(crate) pool_idle_timeout: Duration,

    /// Largest request head (request line and headers) in bytes; larger
    /// ones get 431. Bounds each connection's read buffer too (nginx allows
    /// about 32 KiB). 0: hyper's defaults (about 400 KiB).
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_HEADER_BYTES",
        default_value_t = 32 * 1024
    )]
    pub(crate) max_header_bytes: usize,

    /// Requests one client connection may carry, as HTTP/1.1 keep-alive
    /// requests or HTTP/2 streams (nginx's keepalive_requests): the last one
    /// is answered with `Connection: close` (HTTP/1.1) or followed by a
    /// GOAWAY (HTTP/2), and the client opens a new connection. What still
    /// arrives on it never reaches the upstream: HTTP/2 streams are refused
    /// (REFUSED_STREAM, which clients retry), HTTP/1.1 requests get 503.
    /// However fast a client resets its streams, one connection cannot push
    /// more requests than this to the upstream. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_MAX_REQUESTS_PER_CONNECTION",
        default_value_t = 1000
    )]
    pub(crate) max_requests_per_connection: u64,

    /// HTTP/2 streams a client may reset before their response ended, within
    /// --client-reset-window on one connection (envoy's premature-reset
    /// protection): at this many, when they are also at least half of the
    /// streams it opened in the window, the connection gets a GOAWAY and
    /// closes, and streams that still arrive on it are refused. Each such
    /// stream may have cost the upstream a whole request the client never
    /// read; clients cancelling some of their calls stay far below. 0: off.
    #[arg(long, env = "MCP_ID_GUARD_MAX_CLIENT_RESETS", default_value_t = 250)]
    pub(crate) max_client_resets: u32,

    /// The window --max-client-resets counts in: from a connection's start,
    /// then anew from the first reset after it is over (e.g. 1m, 30s).
    /// Longer windows catch slower floods; 0 turns the reset limit off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_CLIENT_RESET_WINDOW",
        default_value = "1m",
        value_parser = parse_duration
    )]
    pub(crate) client_reset_window: Duration,

    /// Serve /healthz, /readyz (the upstream accepts connections, else 503)
    /// and /metrics (Prometheus text format) on this address, e.g.
    /// 127.0.0.1:9090. Off by default. Keep it off the public network.
    #[arg(long, env = "MCP_ID_GUARD_ADMIN_LISTEN")]
    pub(crate) admin_listen: Option<SocketAddr>,

    /// Most admin connections open at once. At the cap, the admin
    /// connection idle the longest closes to make room for a new one (as
    /// client connections do at --max-connections); while none is idle, new
    /// ones wait until one closes. Admin connections have the head and
    /// keep-alive timeout of client connections (--keep-alive-timeout), and
    /// head and send timeouts of their own (--admin-header-read-timeout,
    /// --admin-send-timeout). Probes and a scraper need a few.
    #[arg(
        long,
        env = "MCP_ID_GUARD_ADMIN_MAX_CONNECTIONS",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) admin_max_connections: u32,

    /// How long a write to an admin client may stay blocked before its
    /// connection is dropped: --send-timeout for admin connections, but
    /// short, so that a client that pipelines requests and never reads the
    /// answers loses its slot in seconds and a liveness probe's /healthz
    /// still gets through. Admin answers are small; a scraper that reads
    /// does not block for long. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_ADMIN_SEND_TIMEOUT",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub(crate) admin_send_timeout: Duration,

    /// How long an admin client may take to send a whole request head (from
    /// its first byte, or from the connection's start): --header-read-timeout
    /// for admin connections, but short, so that clients that start heads
    /// and never finish them, which are not idle and do not make room at the
    /// cap, lose their slots in seconds. Probes and scrapers send a small
    /// head at once. 0: off.
    #[arg(
        long,
        env = "MCP_ID_GUARD_ADMIN_HEADER_READ_TIMEOUT",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub(crate) admin_header_read_timeout: Duration,

    /// Label each tools/call in /metrics with its tool's name
    /// (gen_ai_tool_name), for the first N distinct names; later names are
    /// "other". 0 (the default) leaves tool names out: clients choose them,
    /// and each is a series per decision.
    #[arg(
        long,
        env = "MCP_ID_GUARD_METRICS_TOOL_NAMES",
        default_value_t = 0,
        value_name = "N"
    )]
    pub(crate) metrics_tool_names: usize,

    /// Log format on stderr: text, or json (one object per line, for log
    /// pipelines).
    #[arg(
        long,
        env = "MCP_ID_GUARD_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub(crate) log_format: LogFormat,

    /// On SIGINT/SIGTERM, how long open requests and streams may go on
    /// before they are cut (e.g. 10s).
    #[arg(
        long,
        env = "MCP_ID_GUARD_GRACE_PERIOD",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub(crate) grace_period: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Policy {
    Remap,
    Reject,
    Queue,
}

#[cfg(test)]
mod tests;
