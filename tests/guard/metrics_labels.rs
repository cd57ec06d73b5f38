//! Per-method metrics: `MetricsLayer` outside `IdGuardLayer` on an axum
//! router over loopback counts each JSON-RPC message by its MCP method and
//! the guard's decision (`mcp_id_guard_requests_total` and the
//! `mcp_server_operation_duration_seconds` histogram). The scrape is read
//! line by line and compared exactly (sorted). The control: the same router with the
//! metrics layer and no guard labels nothing (the labels come from the
//! guard's `Exchange`).

use mcp_id_guard::protect::metrics::{Metrics, MetricsLayer};
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use reqwest::StatusCode;

use crate::axum_composition::{client, request_text, send, spawn_send, Server};
use crate::support::wait::within;

/// The scrape's `mcp_id_guard_requests_total` samples, in order; each must
/// have a histogram series with the same labels and count.
fn request_series(metrics: &Metrics, layer: Option<&IdGuardLayer>) -> Vec<String> {
    let mut text = String::new();
    metrics.encode(layer.map(|layer| layer.stats()).as_ref(), &mut text);
    let mut series: Vec<String> = text
        .lines()
        .filter(|line| line.starts_with("mcp_id_guard_requests_total"))
        .map(str::to_owned)
        .collect();
    // Series come in no defined order (prometheus-client's families).
    series.sort();
    for line in &series {
        let histogram = line.replace(
            "mcp_id_guard_requests_total",
            "mcp_server_operation_duration_seconds_count",
        );
        assert!(
            text.contains(&format!("{histogram}\n")),
            "{histogram} in\n{text}"
        );
    }
    series
}

/// A server behind `guard` and a metrics layer outside it, and its metrics.
async fn metered(guard: &IdGuardLayer) -> (Metrics, Server) {
    let metrics = Metrics::new();
    let server = Server::start(|router| {
        router
            .layer(guard.clone())
            .layer(MetricsLayer::new(metrics.clone()))
    })
    .await;
    (metrics, server)
}

fn series(expected: &[(&str, &str, u64)]) -> Vec<String> {
    let mut series: Vec<String> = expected
        .iter()
        .map(|(method, decision, count)| {
            format!(
                "mcp_id_guard_requests_total{{mcp_method_name=\"{method}\",decision=\"{decision}\"}} {count}"
            )
        })
        .collect();
    series.sort();
    series
}

/// Plain requests pass, a duplicate of an id in flight is remapped, a
/// cancellation of it is `cancelled`, a batch counts each member, an
/// escaped method counts as the name it decodes to, and a method outside
/// the MCP list (`hold`) is `other`.
#[tokio::test]
async fn requests_are_counted_by_method_and_decision() {
    let guard = IdGuardLayer::new();
    let (metrics, mut server) = metered(&guard).await;
    let client = client();
    for (id, method) in [("1", "tools/list"), ("2", "ping"), ("3", "tools/call")] {
        let reply = send(&client, &server.url, request_text(id, method)).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let held = spawn_send(&client, &server.url, request_text("7", "hold"));
    assert_eq!(server.entered().await, "7");
    let duplicate = send(&client, &server.url, request_text("7", "tools/call")).await;
    assert_eq!(duplicate.status, StatusCode::OK);
    assert_eq!(guard.stats().remapped_total, 1);
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#;
    send(&client, &server.url, cancel).await;
    assert_eq!(guard.stats().cancelled_total, 1);
    let batch = format!(
        "[{},{}]",
        request_text("10", "ping"),
        request_text("11", "tools/list")
    );
    send(&client, &server.url, batch).await;
    send(&client, &server.url, request_text("13", r"tools\/list")).await;
    server.release(1);
    assert_eq!(within(held).await.unwrap().status, StatusCode::OK);

    assert_eq!(
        request_series(&metrics, Some(&guard)),
        series(&[
            ("ping", "passed", 2),
            ("tools/list", "passed", 3),
            ("tools/call", "passed", 1),
            ("tools/call", "remapped", 1),
            ("notifications/cancelled", "cancelled", 1),
            ("other", "passed", 1),
        ])
    );
}

/// Under `Reject` the duplicate is `rejected`, never forwarded.
#[tokio::test]
async fn a_rejected_duplicate_is_counted_as_rejected() {
    let guard = IdGuardLayer::new().on_duplicate(OnDuplicate::Reject);
    let (metrics, mut server) = metered(&guard).await;
    let client = client();
    let held = spawn_send(&client, &server.url, request_text("1", "hold"));
    assert_eq!(server.entered().await, "1");
    let duplicate = send(&client, &server.url, request_text("1", "tools/call")).await;
    assert_eq!(duplicate.status, StatusCode::BAD_REQUEST);
    server.release(1);
    assert_eq!(within(held).await.unwrap().status, StatusCode::OK);

    assert_eq!(
        request_series(&metrics, Some(&guard)),
        series(&[("tools/call", "rejected", 1), ("other", "passed", 1)])
    );
}

/// The control: without the guard, the metrics layer still counts the
/// responses, but no request carries a method or decision.
#[tokio::test]
async fn without_the_guard_nothing_is_labelled_by_method() {
    let metrics = Metrics::new();
    let server = Server::start(|router| router.layer(MetricsLayer::new(metrics.clone()))).await;
    let client = client();
    for (id, method) in [("1", "tools/list"), ("2", "ping"), ("3", "tools/call")] {
        let reply = send(&client, &server.url, request_text(id, method)).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(request_series(&metrics, None), Vec::<String>::new());
    let mut text = String::new();
    metrics.encode(None, &mut text);
    assert!(
        text.contains("mcp_id_guard_responses_total{status=\"200\"} 3\n"),
        "{text}"
    );
    assert!(!text.contains("mcp_server_operation_duration"), "{text}");
}

/// A `tools/call` of the tool `name` (JSON string contents, escapes kept).
fn call_text(id: &str, name: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"arguments":{{"name":"not this one"}},"name":"{name}"}}}}"#
    )
}

/// Tool names label `tools/call` only when the operator opts in, for the
/// first `max` distinct names (escaped names decoded); later names and names
/// MCP does not allow are `other`. Without the opt-in, the same calls carry
/// no tool label.
#[tokio::test]
async fn tool_names_only_when_asked_and_capped() {
    for max in [2, 0] {
        let metrics = Metrics::new();
        let guard = IdGuardLayer::new();
        let server = Server::start(|router| {
            router
                .layer(guard.clone())
                .layer(MetricsLayer::new(metrics.clone()).tool_names(max))
        })
        .await;
        let client = client();
        let calls = [
            call_text("1", "alpha"),
            call_text("2", "beta"),
            call_text("3", r"\u0061lpha"),
            call_text("4", "gamma"),
            call_text("5", "two words"),
            request_text("6", "tools/list"),
        ];
        for (index, call) in calls.into_iter().enumerate() {
            let reply = send(&client, &server.url, call).await;
            assert_eq!(reply.status, StatusCode::OK, "call {index}: {}", reply.body);
        }
        let scraped = request_series(&metrics, Some(&guard));
        if max == 0 {
            assert_eq!(
                scraped,
                series(&[("tools/list", "passed", 1), ("tools/call", "passed", 5)])
            );
            continue;
        }
        let tool = |name: &str, count: u64| {
            format!(
                "mcp_id_guard_requests_total{{mcp_method_name=\"tools/call\",decision=\"passed\",gen_ai_tool_name=\"{name}\"}} {count}"
            )
        };
        let mut expected = series(&[("tools/list", "passed", 1)]);
        expected.extend([tool("alpha", 2), tool("beta", 1), tool("other", 2)]);
        expected.sort();
        assert_eq!(scraped, expected);
    }
}

/// The guard leaves its `Exchange` only on the responses of requests that ask
/// for it (`WantsExchange`, which `MetricsLayer` inserts): a guard with no
/// such layer outside it adds no extension to any response.
#[tokio::test]
async fn the_exchange_is_left_only_when_asked_for() {
    use bytes::Bytes;
    use http_body_util::Full;
    use mcp_id_guard::exchange::{Exchange, GuardDecision, McpMethod, WantsExchange};
    use tower::{Layer, ServiceExt};

    let guard = IdGuardLayer::new();
    let inner = tower::service_fn(|_: http::Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        ))))
    });
    // Each in a session of its own: the first's unread answer leaves its id
    // abandoned.
    let post = |wants: bool| {
        let mut request = http::Request::post("/mcp")
            .header("content-type", "application/json")
            .header("mcp-session-id", if wants { "asked" } else { "unasked" })
            .body(Full::new(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            )))
            .unwrap();
        if wants {
            request.extensions_mut().insert(WantsExchange);
        }
        request
    };
    let unasked = within(guard.layer(inner).oneshot(post(false)))
        .await
        .unwrap();
    assert!(unasked.extensions().get::<Exchange>().is_none());
    let asked = within(guard.layer(inner).oneshot(post(true)))
        .await
        .unwrap();
    let exchange = asked.extensions().get::<Exchange>().expect("an Exchange");
    let handled: Vec<_> = exchange
        .iter()
        .map(|handled| (handled.method(), handled.decision()))
        .collect();
    assert_eq!(handled, [(McpMethod::Ping, GuardDecision::Passed)]);
}

/// An embedder registers the guard's metrics into the `prometheus_client`
/// registry its application already serves, beside its own metric, and
/// reads the remapped duplicate's series from that registry.
#[tokio::test]
async fn an_embedder_reads_the_guards_series_from_its_own_registry() {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::registry::Registry;

    let mut registry = Registry::default();
    let own: Counter = Counter::default();
    registry.register("app_logins", "The application's own counter", own.clone());
    own.inc();

    let guard = IdGuardLayer::new();
    let (metrics, mut server) = metered(&guard).await;
    metrics.register(&mut registry);
    let stats = guard.clone();
    Metrics::register_stats(&mut registry, move || stats.stats());

    let client = client();
    let held = spawn_send(&client, &server.url, request_text("7", "hold"));
    assert_eq!(server.entered().await, "7");
    let duplicate = send(&client, &server.url, request_text("7", "tools/call")).await;
    assert_eq!(duplicate.status, StatusCode::OK);
    server.release(1);
    assert_eq!(within(held).await.unwrap().status, StatusCode::OK);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for expected in [
        "mcp_id_guard_requests_total{mcp_method_name=\"tools/call\",decision=\"remapped\"} 1\n",
        "mcp_server_operation_duration_seconds_count{mcp_method_name=\"tools/call\",decision=\"remapped\"} 1\n",
        "mcp_id_guard_remapped_total 1\n",
        "mcp_id_guard_in_flight_requests 0\n",
        "app_logins_total 1\n",
    ] {
        assert!(text.contains(expected), "{expected} missing from\n{text}");
    }
}

/// An `initialize` is labelled `initialize`, though the guard does not read
/// a POST without a session: its answer starts one (a success carrying
/// `Mcp-Session-Id`), which only an `initialize` answer does. A session-less
/// POST whose answer starts none (a stateless server) stays `other`, and so
/// does a POST in a session whose answer repeats its `Mcp-Session-Id` (some
/// servers send it on every answer). Also during the restart window, when
/// the guard reads the `initialize` to learn its session.
#[tokio::test]
async fn initialize_is_labelled_initialize() {
    use bytes::Bytes;
    use http_body_util::Full;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};

    // Answers with a session id when told to (`x-start: 1`), echoing the
    // request's own otherwise.
    let inner = tower::service_fn(|request: http::Request<_>| async move {
        let mut response = http::Response::new(Full::new(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":0,"result":{}}"#,
        )));
        let session = match request.headers().get("x-start") {
            Some(_) => Some(http::HeaderValue::from_static("started")),
            None => request.headers().get("mcp-session-id").cloned(),
        };
        if let Some(session) = session {
            response.headers_mut().insert("mcp-session-id", session);
        }
        response.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        Ok::<_, std::convert::Infallible>(response)
    });
    let post = |session: Option<&str>, starts: bool, body: &'static str| {
        let mut request = http::Request::post("/mcp").header("content-type", "application/json");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        if starts {
            request = request.header("x-start", "1");
        }
        request
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let initialize = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
    for window in [Duration::ZERO, Duration::from_secs(60)] {
        let metrics = Metrics::new();
        let guard = IdGuardLayer::new().restart_window(window);
        let service = MetricsLayer::new(metrics.clone()).layer(guard.layer(inner));
        for request in [
            post(None, true, initialize),
            // A stateless server's `initialize`: no session starts.
            post(None, false, initialize),
            // Not JSON-RPC, in a session: passes unread, whatever the
            // answer repeats.
            post(Some("s"), false, "plain text"),
        ] {
            let response = within(service.clone().oneshot(request)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        assert_eq!(
            request_series(&metrics, Some(&guard)),
            series(&[("initialize", "passed", 1), ("other", "passed", 2)]),
            "restart window {window:?}"
        );
    }
}
