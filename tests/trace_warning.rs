//! A subscriber without a tracing-opentelemetry layer of the guard's
//! version (issue 44): everything runs, but a client's `traceparent` cannot
//! be continued and every guard span is a trace of its own. The guard says
//! so once, naming the versions. Its own test binary: the warning is once
//! per process.
#![cfg(feature = "otel")]

#[path = "support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use mcp_id_guard::trace::McpTraceLayer;
use tower::{Layer, ServiceExt};

use support::lines::Lines;

#[tokio::test(flavor = "current_thread")]
async fn a_traceparent_without_a_matching_layer_warns_once_naming_the_versions() {
    let lines = Lines::default();
    let writer = lines.clone();
    // A plain `fmt` subscriber at the default level: no tracing-opentelemetry
    // layer at all (as with one of another version).
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let server = tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
    });
    let service = McpTraceLayer::new().layer(server);
    for id in 1..=3 {
        let request = Request::post("/mcp")
            .header("content-type", "application/json")
            .header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .body(Full::new(Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#
            ))))
            .unwrap();
        let response =
            tokio::time::timeout(Duration::from_secs(5), service.clone().oneshot(request))
                .await
                .expect("answered in time")
                .unwrap();
        response.into_body().collect().await.unwrap();
    }
    let text = lines.text();
    let warnings: Vec<&str> = text.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one warning for three requests:\n{text}");
    assert!(
        warnings[0].contains("tracing-opentelemetry 0.34")
            && warnings[0].contains("opentelemetry 0.33"),
        "the warning names the versions: {}",
        warnings[0]
    );
}
