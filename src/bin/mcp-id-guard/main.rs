//! `mcp-id-guard`: a reverse proxy that puts the id guard in front of an MCP
//! server written in any language.
//!
//! ```text
//! mcp-id-guard --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000
//! ```
//!
//! Everything that protects the upstream is the library's; this program
//! reads the flags (`args`, `settings`) and composes, per client
//! connection: traces (when `OTEL_*` configures them), metrics, the
//! head-size, Host/Origin and body-pace checks, the id guard, the proxy,
//! served by `mcp_id_guard::server`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
use mcp_id_guard::protect::HostLayer;
use mcp_id_guard::trace::legacy::{OtlpConfig, OtlpExporter, TraceLayer};
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tracing_subscriber::EnvFilter;

mod admin;
mod args;
mod limits;
mod probe;
mod settings;

use args::{Args, LogFormat};

fn main() -> ExitCode {
    if probe::requested() {
        return probe::main();
    }
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
    // Whatever is left after the server's grace period goes here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let hosts = args.host_policy()?;
    let descriptors = limits::descriptor_limit();
    let max_upstream = args.max_upstream_connections.map_or_else(
        || limits::connections_for(descriptors).min(1024),
        |max| usize::try_from(max).unwrap_or(usize::MAX),
    );
    let max_connections = args.max_connections.map_or_else(
        || limits::connections_for(descriptors),
        |max| usize::try_from(max).unwrap_or(usize::MAX),
    );
    let proxy = args.proxy(max_upstream)?;
    let guard = args.guard()?;
    let traces = OtlpConfig::from_env().map_err(|error| format!("OpenTelemetry: {error}"))?;

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|error| format!("cannot read the listening address: {error}"))?;
    tracing::info!(
        "mcp-id-guard {} listening on http://{local}, forwarding to {} (duplicate ids: {})",
        env!("CARGO_PKG_VERSION"),
        proxy.upstream(),
        args.policy_name(),
    );
    args.log_limits(max_connections, descriptors, max_upstream);

    let metrics = Metrics::new();
    let exporter = traces.map(|config| {
        tracing::info!(
            "exporting traces to {} (OTLP/HTTP protobuf)",
            config.endpoint()
        );
        OtlpExporter::start(config.metrics(metrics.clone()))
    });
    if let Some(address) = args.admin_listen {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|error| format!("cannot listen on {address} (--admin-listen): {error}"))?;
        let local = listener
            .local_addr()
            .map_err(|error| format!("cannot read the admin address: {error}"))?;
        tracing::info!("admin endpoints on http://{local} (/healthz, /readyz, /metrics)");
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let stats = guard.clone();
        Metrics::register_stats(&mut registry, move || stats.stats());
        let admin = admin::Admin {
            registry,
            upstream: proxy.upstream_address().to_owned(),
            ready_timeout: args.connect_timeout,
        };
        let head_timeout = args.header_read_timeout.max(Duration::from_secs(1));
        tokio::spawn(admin::serve(listener, Arc::new(admin), head_timeout));
    }

    // Per request, outermost first: a span starts as the request arrives
    // (time in every layer counts, a slow body's too) and ends with the
    // response body; metrics see every answer; the cheap checks run before
    // the guard reads a body.
    let per_request = ServiceBuilder::new()
        .layer(
            exporter
                .as_ref()
                .map_or_else(TraceLayer::disabled, TraceLayer::new),
        )
        .layer(MetricsLayer::new(metrics.clone()).tool_names(args.metrics_tool_names))
        .layer(args.head_limit())
        .layer(HostLayer::new(hosts))
        .layer(args.pace())
        .layer(guard.clone());
    let server = args.server(max_connections).metrics(metrics).build();
    let shutdown = async {
        let signal = shutdown_signal().await;
        tracing::info!("{signal} received; no longer accepting connections");
    };
    let make_service = |client| {
        // The client's address goes with the connection's service, not with
        // each request (an extension costs a map per request).
        let proxy = proxy.clone().with_client_addr(client);
        per_request.service(proxy)
    };
    server.serve(listener, make_service, shutdown).await;
    if let Some(exporter) = exporter {
        // Bounded by the export timeout.
        exporter.shutdown().await;
        tracing::info!(
            exported = exporter.exported_spans(),
            dropped = exporter.dropped_spans(),
            "trace exporter stopped"
        );
    }
    Ok(())
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
