//! `mcp-id-guard`: a reverse proxy that puts the id guard in front of an MCP
//! server written in any language.
//!
//! ```text
//! mcp-id-guard --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000
//! ```

use std::convert::Infallible;
use std::future::poll_fn;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use mcp_id_guard::protect::{HostLayer, HostPolicy, Refused};
use mcp_id_guard::proxy::{Proxy, UpstreamFailure};
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_layer::Layer;
use tower_service::Service;
use tracing_subscriber::EnvFilter;

mod admin;
mod args;
mod connection;
mod limits;

use args::{Args, LogFormat, Policy};
use connection::TimedBody;

/// Read buffer room beyond --max-header-bytes, so a head a little over the
/// limit still gets the JSON-RPC answer.
const HEAD_BUFFER_SLACK: usize = 8 * 1024;
/// hyper's smallest HTTP/1 read buffer.
const MIN_READ_BUFFER: usize = 8 * 1024;

/// The first pause after a failed `accept`.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause after failed `accept`s in a row.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().init(),
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "could not start the Tokio runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args));
    // Connections still open after the grace period are cut here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// The Host/Origin checks the flags ask for; an error when the flags leave
/// the host names of a non-loopback listener unsaid.
fn host_policy(args: &Args) -> Result<HostPolicy, String> {
    let mut policy = HostPolicy::loopback();
    if args.allow_any_host {
        policy = policy.any_host();
    } else if !args.allowed_hosts.is_empty() {
        policy = policy
            .allowed_hosts(&args.allowed_hosts)
            .map_err(|error| format!("--allowed-hosts: {error}"))?;
    } else if !args.listen.ip().is_loopback() {
        return Err(format!(
            "listening on {}, which is not a loopback address: name the host names clients use \
             with --allowed-hosts (DNS-rebinding protection), or pass --allow-any-host if \
             something in front of the proxy checks them",
            args.listen
        ));
    }
    if args.allow_any_origin {
        policy = policy.any_origin();
    } else if !args.allowed_origins.is_empty() {
        policy = policy
            .allowed_origins(&args.allowed_origins)
            .map_err(|error| format!("--allowed-origins: {error}"))?;
    }
    Ok(policy)
}

async fn run(args: Args) -> Result<(), String> {
    let hosts = HostLayer::new(host_policy(&args)?);
    let descriptors = limits::descriptor_limit();
    let max_upstream = args.max_upstream_connections.map_or_else(
        || limits::connections_for(descriptors).min(1024),
        |max| usize::try_from(max).unwrap_or(usize::MAX),
    );
    let proxy = Proxy::builder()
        .max_connections(Some(max_upstream))
        .connection_wait(args.upstream_queue_timeout)
        .pool_idle_timeout(args.pool_idle_timeout)
        .connect_timeout(args.connect_timeout)
        .response_timeout(enabled(args.upstream_response_timeout))
        .idle_timeout(enabled(args.upstream_idle_timeout))
        .preserve_host(args.preserve_host)
        .build(&args.upstream)
        .map_err(|error| error.to_string())?;
    let policy = match args.on_duplicate {
        Policy::Remap => OnDuplicate::Remap,
        Policy::Reject => OnDuplicate::Reject,
        Policy::Queue => OnDuplicate::Queue,
    };
    let reject_status = args.reject_status;
    let guard = match &args.id_secret_file {
        Some(path) => IdGuardLayer::new().id_secret(args::read_id_secret(path)?),
        None => IdGuardLayer::new(),
    };
    let guard = guard
        .on_duplicate(policy)
        .reject_status(reject_status)
        .max_body_bytes(args.max_body_bytes)
        .max_in_flight_per_session(args.max_in_flight_per_session as usize)
        .max_queue_wait(args.max_queue_wait)
        .rewrite_all_ids(args.rewrite_all_ids)
        .abandoned_id_ttl(args.abandoned_id_ttl)
        .restart_window(args.restart_window.unwrap_or(args.abandoned_id_ttl))
        .max_session_id_bytes(args.max_session_id_bytes)
        .max_table_bytes(args.max_table_bytes);
    let upstream = proxy.upstream().to_owned();

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|error| format!("cannot read the listening address: {error}"))?;
    let mut policy_name = match policy {
        OnDuplicate::Reject => format!("reject with {reject_status}"),
        OnDuplicate::Queue => format!("queue for up to {:?}", args.max_queue_wait),
        _ => "remap".to_owned(),
    };
    if args.rewrite_all_ids {
        policy_name.push_str("; every id rewritten");
    }
    tracing::info!(
        "mcp-id-guard {} listening on http://{local}, forwarding to {upstream} (duplicate ids: {policy_name})",
        env!("CARGO_PKG_VERSION"),
    );

    let max_connections = args.max_connections.map_or_else(
        || limits::connections_for(descriptors),
        |max| usize::try_from(max).unwrap_or(usize::MAX),
    );
    tracing::info!(
        "client connections: at most {max_connections} open (descriptor limit {descriptors}); \
         upstream connections: at most {max_upstream}; request heads: at most {} bytes; \
         timeouts: request head {}, request body pause {}, blocked send {}, keep-alive {}, \
         upstream response {}, upstream pause {}",
        if args.max_header_bytes == 0 {
            "hyper's default".to_owned()
        } else {
            args.max_header_bytes.to_string()
        },
        shown(args.header_read_timeout),
        shown(args.request_body_timeout),
        shown(args.send_timeout),
        shown(args.keep_alive_timeout),
        shown(args.upstream_response_timeout),
        shown(args.upstream_idle_timeout),
    );

    let mut server = auto::Builder::new(TokioExecutor::new());
    // The connection watchdog times request heads (hyper's own timer would
    // also cut idle keep-alive connections, and never sees protocol
    // detection or HTTP/2).
    server
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    server.http2().timer(TokioTimer::new());
    let max_header_bytes = (args.max_header_bytes > 0).then_some(args.max_header_bytes);
    if let Some(max) = max_header_bytes {
        // A head that outgrows the read buffer gets hyper's own bare 431;
        // one that fits but is over the limit gets the JSON-RPC 431 below.
        server
            .http1()
            .max_buf_size(max.saturating_add(HEAD_BUFFER_SLACK).max(MIN_READ_BUFFER));
        server
            .http2()
            .max_header_list_size(u32::try_from(max).unwrap_or(u32::MAX));
    }
    let limits = connection::Limits {
        header_read: enabled(args.header_read_timeout),
        keep_alive: enabled(args.keep_alive_timeout),
        body_idle: enabled(args.request_body_timeout),
        send: enabled(args.send_timeout),
        max_requests: (args.max_requests_per_connection > 0)
            .then_some(args.max_requests_per_connection),
        resets: (args.max_client_resets > 0 && !args.client_reset_window.is_zero()).then_some(
            connection::ResetBudget {
                max: args.max_client_resets,
                window: args.client_reset_window,
            },
        ),
    };
    tracing::info!(
        "per client connection: at most {} requests, at most {} HTTP/2 streams reset by the client \
         before their response",
        shown_count(args.max_requests_per_connection),
        match limits.resets {
            Some(budget) => format!("{} per {:?}", budget.max, budget.window),
            None => "any number of".to_owned(),
        },
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // One permit per open client connection: when none is left, the proxy
    // stops accepting (the kernel's backlog holds new connections) instead
    // of running out of descriptors.
    let permits = Arc::new(Semaphore::new(max_connections));
    let metrics = match args.admin_listen {
        Some(address) => {
            let metrics = Arc::new(admin::Metrics::new());
            let admin = admin::Admin::new(
                &metrics,
                guard.clone(),
                Arc::clone(&permits),
                max_connections,
                upstream_authority(&upstream),
                args.connect_timeout,
            );
            let listener = TcpListener::bind(address)
                .await
                .map_err(|error| format!("cannot listen on {address} (--admin-listen): {error}"))?;
            let local = listener
                .local_addr()
                .map_err(|error| format!("cannot read the admin address: {error}"))?;
            tracing::info!("admin endpoints on http://{local} (/healthz, /readyz, /metrics)");
            tokio::spawn(admin::serve(
                listener,
                Arc::new(admin),
                args.header_read_timeout.max(Duration::from_secs(1)),
            ));
            Some(metrics)
        }
        None => None,
    };
    let mut full_warning = limits::Every::new(Duration::from_secs(10));
    let mut accept_warning = limits::Every::new(Duration::from_secs(10));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut shutdown = std::pin::pin!(shutdown_signal());

    let signal = loop {
        if permits.available_permits() == 0 {
            if let Some(suppressed) = full_warning.ready() {
                tracing::warn!(
                    "{max_connections} client connections open (--max-connections); new ones wait \
                     until one closes ({suppressed} more times since the last such line)"
                );
            }
        }
        // Wait for room without holding a permit while `accept` waits: the
        // permits in use are the open connections (`/metrics` reads them).
        tokio::select! {
            permit = permits.acquire() => match permit {
                Ok(permit) => drop(permit),
                Err(_) => break "the connection table closed",
            },
            signal = &mut shutdown => break signal,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    accepted
                }
                Err(error) => {
                    // Out of descriptors and the like: each retry would fail
                    // the same way at once. Back off (up to a second) and log
                    // a line per interval, not per attempt.
                    if let Some(suppressed) = accept_warning.ready() {
                        tracing::warn!(
                            %error,
                            "accept failed; retrying in {backoff:?} ({suppressed} more failures since the last such line)"
                        );
                    }
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        signal = &mut shutdown => break signal,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
            signal = &mut shutdown => break signal,
        };
        // Only this loop takes permits, so the one seen free above still is.
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            continue;
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        let activity = connection::Activity::new(&limits, metrics.clone());
        // The client's address goes with the connection's service, not with
        // each request (an extension costs a map per request).
        // Checked before the guard reads anything: a rebound page's
        // request never reaches the upstream.
        let service = hosts.layer(guard.layer(proxy.clone().with_client_addr(peer)));
        let watched = Arc::clone(&activity);
        let body_idle = limits.body_idle;
        let send = limits.send;
        let metrics = metrics.clone();
        let per_connection = hyper::service::service_fn(move |request: Request<Incoming>| {
            let http2 = request.version() == http::Version::HTTP_2;
            let (mut active, admission) = watched.request_started(http2);
            let (parts, body) = request.into_parts();
            let request = Request::from_parts(
                parts,
                connection::TimedBody::new(body, body_idle, Arc::clone(&watched)),
            );
            let mut service = service.clone();
            let metrics = metrics.clone();
            // Read the clock only when someone keeps the latency.
            let started = metrics.as_ref().map(|_| std::time::Instant::now());
            // A connection past its budget forwards nothing more. HTTP/2
            // streams its client opened before it saw the GOAWAY are
            // refused (REFUSED_STREAM: not processed, safe to send again on
            // a new connection, which h2 clients do by themselves); a
            // pipelined HTTP/1.1 request gets a 503 here.
            let mut refuse_stream = false;
            let closing = match admission {
                connection::Admission::Refuse(_) if http2 => {
                    refuse_stream = true;
                    None
                }
                connection::Admission::Refuse(reason) => Some(connection_closing(reason)),
                _ => None,
            };
            let too_large = closing.or_else(|| {
                max_header_bytes
                    .filter(|max| head_size(&request) > *max)
                    .map(header_too_large)
            });
            let too_large = too_large.map(|response| response.map(Either::Right));
            let closing_kind = matches!(admission, connection::Admission::Refuse(_));
            async move {
                if refuse_stream {
                    if let Some(metrics) = &metrics {
                        metrics.refused("connection_closing");
                    }
                    // hyper resets the stream with the reason it finds in
                    // the error; not a reset by the client.
                    active.finish();
                    return Err(h2::Error::from(h2::Reason::REFUSED_STREAM));
                }
                let (mut response, failure) = if let Some(response) = too_large {
                    if let Some(metrics) = &metrics {
                        metrics.refused(if closing_kind {
                            "connection_closing"
                        } else {
                            "header_size"
                        });
                    }
                    (response, None)
                } else {
                    poll_fn(|cx| Service::<Request<TimedBody>>::poll_ready(&mut service, cx))
                        .await
                        .unwrap_or_else(|never: Infallible| match never {});
                    let response = service
                        .call(request)
                        .await
                        .unwrap_or_else(|never: Infallible| match never {});
                    if let (Some(metrics), Some(kind)) =
                        (&metrics, response.extensions().get::<Refused>())
                    {
                        metrics.refused(kind.as_str());
                    }
                    let failure = response.extensions().get::<UpstreamFailure>().copied();
                    (response.map(Either::Left), failure)
                };
                if !http2 && admission != connection::Admission::Serve {
                    // hyper closes an HTTP/1.1 connection after a response
                    // that says so, whenever the watchdog's graceful close
                    // lands.
                    response.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
                if let (Some(metrics), Some(started)) = (&metrics, started) {
                    metrics.answered(response.status(), failure, started.elapsed());
                }
                Ok::<_, h2::Error>(
                    response.map(|body| connection::Tracked::new(body, active, send)),
                )
            }
        });
        let served = server
            .serve_connection(
                TokioIo::new(connection::Watched::new(stream, Arc::clone(&activity))),
                per_connection,
            )
            .into_owned();
        let stopped = stopped.clone();
        tokio::spawn(async move {
            connection::drive(
                served,
                |served| served.graceful_shutdown(),
                activity,
                limits,
                stopped,
                peer,
            )
            .await;
            drop(permit);
        });
    };
    tracing::info!("{signal} received; no longer accepting connections");
    drop(listener);

    let _ = stop.send(true);
    let open = max_connections - permits.available_permits();
    if open > 0 {
        tracing::info!(
            "waiting up to {:?} for {open} open connection(s) to finish",
            args.grace_period
        );
    }
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    match tokio::time::timeout(args.grace_period, permits.acquire_many(all)).await {
        Ok(_) => tracing::info!("shut down"),
        Err(_) => tracing::warn!(
            "grace period of {:?} over; cutting the connections still open",
            args.grace_period
        ),
    }
    Ok(())
}

/// The size of a request head as HTTP/1.1 sends it: request line, and each
/// header as `name: value` and a line break.
fn head_size<B>(request: &Request<B>) -> usize {
    let uri = request.uri();
    let target = uri
        .path_and_query()
        .map_or(1, |target| target.as_str().len())
        + uri
            .authority()
            .map_or(0, |authority| authority.as_str().len());
    let line = request.method().as_str().len() + target + 12;
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + line
}

/// `431` with a JSON-RPC error (the body has not been read: `id` null).
fn header_too_large(max: usize) -> http::Response<Full<Bytes>> {
    error_reply(
        http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        -32600,
        &format!("Invalid Request: request headers exceed the limit of {max} bytes"),
    )
}

/// `503` with a JSON-RPC error for an HTTP/1.1 request that arrived on a
/// connection the proxy is closing (pipelined after its last request): the
/// client may send it again on a new connection.
fn connection_closing(reason: connection::Closing) -> http::Response<Full<Bytes>> {
    let why = match reason {
        connection::Closing::RequestCap => "this connection has carried its last request",
        connection::Closing::ClientResets => "this connection reset too many requests",
    };
    error_reply(
        http::StatusCode::SERVICE_UNAVAILABLE,
        -32000,
        &format!("Service Unavailable: {why}; send it again on a new connection"),
    )
}

/// `status` with a JSON-RPC error whose `id` is null (the body has not been
/// read).
fn error_reply(status: http::StatusCode, code: i32, message: &str) -> http::Response<Full<Bytes>> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    let mut response = http::Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// `host:port` of an upstream base URL such as `http://127.0.0.1:8000/mcp`
/// (port 80 when it names none), for the readiness probe.
fn upstream_authority(upstream: &str) -> String {
    let authority = upstream
        .parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.authority().cloned());
    match authority {
        Some(authority) if authority.port().is_some() => authority.as_str().to_owned(),
        Some(authority) => format!("{}:80", authority.host()),
        None => upstream.to_owned(),
    }
}

/// A duration flag where `0` turns the limit off.
fn enabled(limit: Duration) -> Option<Duration> {
    (!limit.is_zero()).then_some(limit)
}

/// A duration flag for the startup line.
fn shown(limit: Duration) -> String {
    if limit.is_zero() {
        "off".to_owned()
    } else {
        format!("{limit:?}")
    }
}

/// A count flag where `0` turns the limit off, for the startup line.
fn shown_count(limit: u64) -> String {
    if limit == 0 {
        "any number of".to_owned()
    } else {
        limit.to_string()
    }
}

/// Resolves with the signal's name on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            },
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the proxy");
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{parse_duration, parse_reject_status, read_id_secret};

    #[test]
    fn id_secret_files_hold_32_hex_digits() {
        let dir = std::env::temp_dir().join(format!("mcp-id-guard-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "000102030405060708090a0b0c0d0e0F\n").unwrap();
        assert_eq!(
            read_id_secret(&file).unwrap(),
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
        );
        for bad in [
            "",
            "0011",
            "zz0102030405060708090a0b0c0d0e0f",
            "000102030405060708090a0b0c0d0e0f00",
        ] {
            std::fs::write(&file, bad).unwrap();
            assert!(read_id_secret(&file).is_err(), "{bad:?}");
        }
        assert!(read_id_secret(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5h").is_err());
    }

    #[test]
    fn arguments() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let args = Args::try_parse_from([
            "mcp-id-guard",
            "--upstream",
            "http://127.0.0.1:8000/mcp",
            "--on-duplicate",
            "reject",
            "--reject-status",
            "409",
        ])
        .unwrap();
        assert_eq!(args.on_duplicate, Policy::Reject);
        assert_eq!(args.reject_status, http::StatusCode::CONFLICT);
        assert_eq!(args.abandoned_id_ttl, Duration::from_secs(300));
        assert_eq!(args.restart_window, None, "as long as the abandoned-id TTL");
        assert_eq!(args.max_session_id_bytes, 8 * 1024);
        assert_eq!(args.max_table_bytes, 64 * 1024 * 1024);
        assert!(!args.rewrite_all_ids);
        assert_eq!(args.max_requests_per_connection, 1000);
        assert_eq!(args.max_client_resets, 250);
        assert_eq!(args.client_reset_window, Duration::from_secs(60));
        let args = Args::try_parse_from([
            "mcp-id-guard",
            "--upstream",
            "http://h",
            "--on-duplicate",
            "queue",
            "--max-queue-wait",
            "2s",
            "--rewrite-all-ids",
            "--reject-status",
            "422",
            "--abandoned-id-ttl",
            "0",
            "--restart-window",
            "1m",
            "--max-table-bytes",
            "1048576",
        ])
        .unwrap();
        assert_eq!(args.restart_window, Some(Duration::from_secs(60)));
        assert_eq!(args.max_table_bytes, 1 << 20);
        assert_eq!(args.reject_status.as_u16(), 422);
        assert_eq!(args.abandoned_id_ttl, Duration::ZERO);
        assert_eq!(args.on_duplicate, Policy::Queue);
        assert_eq!(args.max_queue_wait, Duration::from_secs(2));
        assert!(args.rewrite_all_ids);
        assert!(Args::try_parse_from([
            "mcp-id-guard",
            "--upstream",
            "http://h",
            "--reject-status",
            "500"
        ])
        .is_err());
        for bad in ["200", "99", "600", "4xx", ""] {
            assert!(parse_reject_status(bad).is_err(), "{bad:?} accepted");
        }
    }
}
