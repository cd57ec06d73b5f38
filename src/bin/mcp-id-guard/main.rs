//! `mcp-id-guard`: a reverse proxy that puts the id guard in front of an MCP
//! server written in any language.
//!
//! ```text
//! mcp-id-guard --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000
//! mcp-id-guard --listen 127.0.0.1:8080 --upstream-port 3000 -- node server.js
//! ```
//!
//! Everything that protects the upstream is the library's; this program
//! reads the flags (`args`, `settings`) and composes, per client
//! connection: traces (when `OTEL_*` configures them), metrics, the
//! head-size, Host/Origin and body-pace checks, request bodies read whole
//! under a memory budget, the id guard, the proxy, served by
//! `mcp_id_guard::server`. With a command after `--`, it also runs the
//! upstream (`child`).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mcp_id_guard::protect::host::HostLayer;
use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
use mcp_id_guard::trace::McpTraceLayer;
use tokio::net::TcpListener;
use tower::{Layer as _, ServiceBuilder};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

mod admin;
mod args;
mod child;
mod limits;
mod probe;
mod settings;
mod signals;
mod telemetry;

use args::{Args, LogFormat};

fn main() -> ExitCode {
    if probe::requested() {
        return probe::main();
    }
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("could not start the Tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // The exporters' clients run on the runtime.
    let traces = {
        let _entered = runtime.enter();
        telemetry::Telemetry::from_env()
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match args.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => logs.json().boxed(),
    };
    // The guard's spans go to the exporter whatever RUST_LOG says; nothing
    // else does.
    let spans = traces.as_ref().ok().and_then(Option::as_ref).map(|traces| {
        tracing_opentelemetry::layer()
            .with_tracer(traces.tracer())
            .with_filter(Targets::new().with_target("mcp_id_guard::trace", tracing::Level::INFO))
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .init();
    let result = match traces {
        Ok(traces) => runtime.block_on(run(args, traces)),
        Err(error) => Err(format!("OpenTelemetry: {error}")),
    };
    // Whatever is left after the server's grace period goes here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until SIGINT/SIGTERM (or until the upstream command exits);
/// returns the exit code: 0, or the upstream command's.
async fn run(args: Args, traces: Option<telemetry::Telemetry>) -> Result<u8, String> {
    let mut signals = signals::Signals::new();
    let hosts = args.host_policy()?;
    let descriptors = limits::descriptor_limit();
    // The admin connections' descriptors come out of the same limit (kept
    // whether or not the admin listener is on, so that turning it on does
    // not change the client connection cap).
    let reserved = args.admin_max_connections();
    let max_upstream = args.max_upstream_connections.map_or_else(
        || limits::connections_for(descriptors, reserved).min(1024),
        |max| usize::try_from(max).unwrap_or(usize::MAX),
    );
    let max_connections = args.max_connections.map_or_else(
        || limits::connections_for(descriptors, reserved),
        |max| usize::try_from(max).unwrap_or(usize::MAX),
    );
    let proxy = args.proxy(max_upstream)?;
    let guard = args.guard()?;

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|error| format!("cannot read the listening address: {error}"))?;
    // Connections that arrive while the upstream command starts wait in the
    // listener's backlog.
    let mut upstream = match args.upstream_port.filter(|_| !args.command.is_empty()) {
        None => None,
        Some(port) => {
            match child::Upstream::start(
                &args.command,
                port,
                args.upstream_start_timeout,
                &mut signals,
            )
            .await
            {
                Ok(upstream) => Some(upstream),
                Err(child::NotStarted::Failed(message)) => return Err(message),
                Err(child::NotStarted::Stopped(stop, status)) => {
                    tracing::info!(
                        "{} received while the upstream command started; passed on, it exited ({status})",
                        stop.name()
                    );
                    return Ok(child::exit_code(status));
                }
            }
        }
    };
    tracing::info!(
        "mcp-id-guard {} listening on http://{local}, forwarding to {} (duplicate ids: {})",
        env!("CARGO_PKG_VERSION"),
        proxy.upstream(),
        args.policy_name(),
    );
    args.log_limits(max_connections, descriptors, max_upstream);

    let metrics = Metrics::new();
    let body_buffer = args.body_buffer();
    if let Some(traces) = &traces {
        tracing::info!("exporting traces to {}", traces.description);
    }
    if let Some(address) = args.admin_listen {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|error| format!("cannot listen on {address} (--admin-listen): {error}"))?;
        let local = listener
            .local_addr()
            .map_err(|error| format!("cannot read the admin address: {error}"))?;
        tracing::info!(
            "admin endpoints on http://{local} (/healthz, /readyz, /metrics; at most {} connections)",
            args.admin_max_connections
        );
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let stats = guard.clone();
        Metrics::register_stats(&mut registry, move || stats.stats());
        Metrics::register_body_budget(&mut registry, body_buffer.budget().clone());
        if let Some(traces) = &traces {
            traces.register(&mut registry);
        }
        let admin = admin::Admin {
            registry,
            upstream: proxy.upstream_address().to_owned(),
            ready_timeout: args.connect_timeout,
        };
        tokio::spawn(admin::serve(listener, Arc::new(admin), args.admin_server()));
    }

    // Per request, outermost first: a span starts as the request arrives
    // (time in every layer counts, a slow body's too) and ends with the
    // response body; metrics see every answer; the cheap checks run before
    // the guard reads a body. The body buffer (which needs the connection's
    // address) and the guard are added per connection, innermost.
    let per_request = ServiceBuilder::new()
        .layer(if traces.is_some() {
            McpTraceLayer::new()
        } else {
            McpTraceLayer::disabled()
        })
        .layer(MetricsLayer::new(metrics.clone()).tool_names(args.metrics_tool_names))
        .layer(args.head_limit())
        .layer(HostLayer::new(hosts))
        .layer(args.pace());
    let server = args.server(max_connections).metrics(metrics).build();
    // How serving ended: a signal (passed on to the upstream command, if
    // any), or the upstream command's own exit.
    let mut exited = None;
    let shutdown = async {
        tokio::select! {
            stop = signals.recv() => match upstream.as_mut() {
                Some(upstream) => {
                    upstream.signal(stop);
                    tracing::info!(
                        "{} received and passed on to the upstream command; no longer accepting connections",
                        stop.name()
                    );
                }
                None => tracing::info!("{} received; no longer accepting connections", stop.name()),
            },
            status = async {
                match upstream.as_mut() {
                    Some(upstream) => upstream.exited().await,
                    None => std::future::pending().await,
                }
            } => {
                let command = upstream.as_ref().map_or("", |upstream| upstream.command());
                match &status {
                    Ok(status) => tracing::error!(
                        "the upstream command `{command}` exited by itself ({status}); shutting down"
                    ),
                    Err(message) => tracing::error!("{message}; shutting down"),
                }
                exited = Some(status);
            }
        }
    };
    let make_service = |client: std::net::SocketAddr| {
        // The client's address goes with the connection's service, not with
        // each request (an extension costs a map per request).
        let proxy = proxy.clone().with_client_addr(client);
        // The bodies of the connection count against its address's share.
        let bodies = body_buffer.for_client(client.ip());
        per_request.service(bodies.layer(guard.layer(proxy)))
    };
    server.serve(listener, make_service, shutdown).await;
    let code = match (upstream.as_mut(), exited) {
        (None, _) => Ok(0),
        (Some(_), Some(status)) => status.map(child::exit_code),
        (Some(upstream), None) => upstream.stop(child::STOP_TIMEOUT).await.map(|status| {
            tracing::info!("the upstream command exited ({status})");
            child::exit_code(status)
        }),
    };
    if let Some(traces) = traces {
        // Bounded by two export timeouts.
        traces.shutdown().await;
    }
    code
}
