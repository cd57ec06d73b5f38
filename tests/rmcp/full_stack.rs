//! `examples/full_stack.rs` exactly as the example builds it (this file
//! includes it), over loopback with a real client: the seed's burst, a tool
//! cut by the response-body timeout and its id reused, and the placement
//! guide's claims (compression per SSE event, CORS against `HostLayer`, the
//! queue behind `TimeoutLayer`, body limits either side of the guard).
//!
//! Every exchange has a wall-clock deadline; ordering uses the guard's
//! counters (polled within a bound), and the tool's own duration is the only
//! clock the scenarios rely on.

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use http::{HeaderMap, StatusCode};
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use serde_json::{json, Value};
use tower::{Layer as _, ServiceBuilder};
use tower_http::compression::predicate::SizeAbove;
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;

use crate::support::client::{burst_delay, Session};
use crate::support::ids::{find_response, raw_id};
use crate::support::sse;
use crate::support::wait::{assert_released, stats_when};
use crate::support::{OK_TIMEOUT, WAIT_TIMEOUT};

#[allow(dead_code)] // `main` and `Timeouts::PRODUCTION` are the example's.
#[path = "../../examples/full_stack.rs"]
mod example;

use example::{app, mcp_service, Timeouts, BROWSER_ORIGIN};

/// Short limits for the tests; no keep-alive comments, so the body timeout
/// sees a silent tool's silence (as `Timeouts::PRODUCTION` arranges).
const TEST_TIMEOUTS: Timeouts = Timeouts {
    response_head: Duration::from_secs(5),
    response_body_idle: Duration::from_secs(2),
    sse_keep_alive: None,
};

/// An application served on `127.0.0.1:<ephemeral>` until dropped.
struct Served {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(app: axum::Router) -> anyhow::Result<Served> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Served { url, task })
}

/// What a POST got back, its body decompressed.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    /// The body as it arrived (gzip-decoded when it was gzipped).
    body: String,
    /// A transport error cut the body.
    cut: bool,
}

impl Answer {
    /// The text and the exact id JSON text of the first JSON-RPC response.
    fn result(&self) -> Option<(String, String)> {
        let response = find_response(&self.body)?;
        let text = response
            .pointer("/result/content/0/text")
            .and_then(Value::as_str)?
            .to_owned();
        let raw = sse::events(&self.body)
            .into_iter()
            .map(|event| event.data)
            .find(|data| data.contains("\"result\""))?;
        Some((text, raw_id(&raw)?))
    }
}

/// A `tools/call` of `slow_echo` with the id `id` (JSON text).
fn slow_echo(id: &str, text: &str, ms: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"slow_echo","arguments":{{"text":"{text}","ms":{ms}}}}}}}"#
    )
}

/// Sends `request` and reads the whole answer within `within`.
async fn send(request: reqwest::RequestBuilder, within: Duration) -> anyhow::Result<Answer> {
    tokio::time::timeout(within, async {
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut bytes = Vec::new();
        let mut cut = false;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(_) => {
                    cut = true;
                    break;
                }
            }
        }
        let gzipped = headers
            .get("content-encoding")
            .is_some_and(|value| value == "gzip");
        if gzipped {
            let mut decoder = flate2::write::GzDecoder::new(Vec::new());
            // A cut stream is a truncated gzip member: keep what decodes.
            let _ = decoder.write_all(&bytes);
            let _ = decoder.flush();
            bytes = std::mem::take(decoder.get_mut());
        }
        anyhow::Ok(Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
            cut,
        })
    })
    .await
    .context("the answer did not end in time")?
}

/// The seed's burst (issue #1): one session, twelve concurrent `tools/call`
/// of a slow tool, all with `id: 1`, each with its own sentinel, finishing
/// in shuffled order, through the whole stack with gzip asked for. Each gets
/// its own answer with `id: 1` restored, compressed on the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seed_burst_through_the_full_stack_gets_twelve_own_answers() -> anyhow::Result<()> {
    const BURST: usize = 12;
    let guard = IdGuardLayer::new();
    let served = serve(app(guard.clone(), TEST_TIMEOUTS)).await?;
    let session = Session::open(&served.url).await?;

    let calls = (0..BURST).map(|i| {
        let sentinel = format!("burst-{i:02}");
        let request = session
            .post_json(serde_json::from_str(&slow_echo(
                "1",
                &sentinel,
                300 + burst_delay(i, BURST),
            ))?)
            .header("accept-encoding", "gzip");
        anyhow::Ok(async move { (sentinel, send(request, OK_TIMEOUT).await) })
    });
    let answers = futures::future::join_all(calls.collect::<anyhow::Result<Vec<_>>>()?).await;

    for (sentinel, answer) in answers {
        let answer = answer.with_context(|| format!("{sentinel}: no answer"))?;
        assert_eq!(answer.status, StatusCode::OK, "{sentinel}: {answer:?}");
        assert_eq!(
            answer.headers.get("content-encoding").map(|v| v.as_bytes()),
            Some(&b"gzip"[..]),
            "{sentinel}: the SSE answer is compressed"
        );
        assert_eq!(
            answer.result(),
            Some((sentinel.clone(), "1".to_owned())),
            "{sentinel}: its own answer, with id 1 restored: {answer:?}"
        );
        assert!(
            !answer.body.contains("mcp-id-guard:"),
            "{sentinel}: {answer:?}"
        );
    }
    let stats = assert_released(&guard).await;
    assert!(stats.remapped_total >= 1, "{stats:?}");
    Ok(())
}

/// A tool that outlives the response-body timeout: its stream is cut (no
/// answer), its id stays abandoned, and an `id: 1` sent while it still runs
/// is remapped, so it gets its own answer rather than the late one. Unguarded,
/// the cut call's late answer (`late`) reaches the reuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_cut_by_the_body_timeout_leaves_its_id_abandoned() -> anyhow::Result<()> {
    let guard = IdGuardLayer::new();
    let served = serve(app(guard.clone(), TEST_TIMEOUTS)).await?;
    let session = Session::open(&served.url).await?;
    let idle = TEST_TIMEOUTS.response_body_idle;

    // Cut after 2 s of silence; the server answers at 2.6 s, while the reuse
    // below (sent at about 2 s, working 1.2 s, under the timeout) runs.
    let late_ms = (idle + Duration::from_millis(600)).as_millis() as u64;
    let late = send(
        session.post_json(serde_json::from_str(&slow_echo("1", "late", late_ms))?),
        OK_TIMEOUT,
    )
    .await?;
    assert_eq!(late.status, StatusCode::OK);
    assert!(late.cut, "the body timeout cuts the stream: {late:?}");
    assert_eq!(late.result(), None, "{late:?}");

    // Sent at once: whether the guard has seen the cut yet (the id
    // abandoned) or not (the id still in flight), the reuse is remapped.
    let reuse_ms = (idle * 3 / 5).as_millis() as u64;
    let reuse = send(
        session.post_json(serde_json::from_str(&slow_echo("1", "reuse", reuse_ms))?),
        OK_TIMEOUT,
    )
    .await?;
    assert_eq!(
        reuse.result(),
        Some(("reuse".to_owned(), "1".to_owned())),
        "the reuse gets its own answer, id 1 restored: {reuse:?}"
    );
    let stats = stats_when(&guard, WAIT_TIMEOUT, |stats| stats.in_flight_requests == 0).await;
    assert_eq!(stats.remapped_total, 1, "the reuse was remapped: {stats:?}");
    assert_eq!(
        stats.abandoned_ids, 1,
        "the cut call's id stays abandoned: {stats:?}"
    );
    Ok(())
}

/// What does not cut a slow tool: `TimeoutLayer` (rmcp sends the SSE
/// headers of a tool call at once, so the head is never late), nor a
/// response-body timeout longer than rmcp's keep-alive interval (each
/// keep-alive comment is a frame, which restarts the silence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_the_head_timeout_nor_a_kept_alive_body_timeout_cuts_a_slow_tool(
) -> anyhow::Result<()> {
    let short_head = Timeouts {
        response_head: Duration::from_millis(300),
        ..TEST_TIMEOUTS
    };
    let kept_alive = Timeouts {
        response_body_idle: Duration::from_millis(500),
        sse_keep_alive: Some(Duration::from_millis(100)),
        ..TEST_TIMEOUTS
    };
    for (timeouts, ms) in [(short_head, 1000), (kept_alive, 1500)] {
        let served = serve(app(IdGuardLayer::new(), timeouts)).await?;
        let session = Session::open(&served.url).await?;
        let answer = send(
            session.post_json(serde_json::from_str(&slow_echo("1", "slow", ms))?),
            OK_TIMEOUT,
        )
        .await?;
        assert_eq!(answer.status, StatusCode::OK, "{timeouts:?}: {answer:?}");
        assert_eq!(
            answer.result(),
            Some(("slow".to_owned(), "1".to_owned())),
            "{timeouts:?}: {answer:?}"
        );
    }
    Ok(())
}

/// tower-http's default predicate skips SSE; the example's compresses it,
/// and the stream still arrives event by event: the priming event decodes
/// before the tool has answered (async-compression flushes whenever the
/// server pauses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_sse_still_streams_event_by_event() -> anyhow::Result<()> {
    let served = serve(app(IdGuardLayer::new(), TEST_TIMEOUTS)).await?;
    let session = Session::open(&served.url).await?;
    let response = tokio::time::timeout(
        OK_TIMEOUT,
        session
            .post_json(serde_json::from_str(&slow_echo("1", "streamed", 1000))?)
            .header("accept-encoding", "gzip")
            .send(),
    )
    .await??;
    assert_eq!(
        response
            .headers()
            .get("content-encoding")
            .map(|v| v.as_bytes()),
        Some(&b"gzip"[..])
    );
    let mut decoder = flate2::write::GzDecoder::new(Vec::new());
    let mut stream = response.bytes_stream();
    let mut first_event_alone = None;
    tokio::time::timeout(OK_TIMEOUT, async {
        while let Some(chunk) = stream.next().await {
            decoder.write_all(&chunk?)?;
            decoder.flush()?;
            let text = String::from_utf8_lossy(decoder.get_ref()).into_owned();
            if first_event_alone.is_none() && !sse::events(&text).is_empty() {
                first_event_alone = Some(!text.contains("streamed"));
            }
        }
        anyhow::Ok(())
    })
    .await??;
    let text = String::from_utf8_lossy(decoder.get_ref()).into_owned();
    assert_eq!(
        first_event_alone,
        Some(true),
        "the priming event arrives before the answer: {text}"
    );
    assert!(text.contains("streamed"), "{text}");
    Ok(())
}

/// A `CompressionLayer` inside the guard compresses nothing: the guard drops
/// `Accept-Encoding` on the requests whose responses it reads. The control:
/// the same layer over the bare server compresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_inside_the_guard_compresses_nothing() -> anyhow::Result<()> {
    let compression = || CompressionLayer::new().compress_when(SizeAbove::default());
    for guarded in [false, true] {
        let compressed = ServiceBuilder::new()
            .layer(compression())
            .service(mcp_service(TEST_TIMEOUTS));
        let router = if guarded {
            axum::Router::new().nest_service("/mcp", IdGuardLayer::new().layer(compressed))
        } else {
            axum::Router::new().nest_service("/mcp", compressed)
        };
        let served = serve(router).await?;
        let session = Session::open(&served.url).await?;
        let answer = send(
            session
                .post_json(serde_json::from_str(&slow_echo("1", "inside", 0))?)
                .header("accept-encoding", "gzip"),
            OK_TIMEOUT,
        )
        .await?;
        assert_eq!(
            answer.headers.contains_key("content-encoding"),
            !guarded,
            "guarded {guarded}: {answer:?}"
        );
        assert_eq!(answer.result(), Some(("inside".to_owned(), "1".to_owned())));
    }
    Ok(())
}

/// `CorsLayer` answers a preflight itself (it never meets `HostLayer`); the
/// POST from a foreign origin then gets `HostLayer`'s 403, one from the
/// allowed origin passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflights_pass_and_host_layer_refuses_the_foreign_post() -> anyhow::Result<()> {
    let served = serve(app(IdGuardLayer::new(), TEST_TIMEOUTS)).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let preflight = |origin: &'static str| {
        http.request(reqwest::Method::OPTIONS, &served.url)
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type,mcp-session-id",
            )
    };
    let initialize = |origin: &'static str| {
        http.post(&served.url)
            .header("origin", origin)
            .header("accept", crate::support::ACCEPT)
            .header("content-type", "application/json")
            .body(crate::support::client::initialize_message("cors").to_string())
    };

    let foreign = send(preflight("http://evil.example"), OK_TIMEOUT).await?;
    assert_eq!(foreign.status, StatusCode::OK, "{foreign:?}");
    // `AllowOrigin::exact` names its one origin whoever asks: the browser
    // refuses the foreign page's POST, and `HostLayer` would too.
    assert_eq!(
        foreign.headers["access-control-allow-origin"],
        BROWSER_ORIGIN
    );
    let allowed = send(preflight(BROWSER_ORIGIN), OK_TIMEOUT).await?;
    assert_eq!(allowed.status, StatusCode::OK, "{allowed:?}");
    assert_eq!(
        allowed.headers["access-control-allow-origin"],
        BROWSER_ORIGIN
    );

    let refused = send(initialize("http://evil.example"), OK_TIMEOUT).await?;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{refused:?}");
    let passed = send(initialize(BROWSER_ORIGIN), OK_TIMEOUT).await?;
    assert_eq!(passed.status, StatusCode::OK, "{passed:?}");
    assert_eq!(
        passed.headers["access-control-allow-origin"],
        BROWSER_ORIGIN
    );
    Ok(())
}

/// Under `OnDuplicate::Queue`, a duplicate waits for its turn before any
/// response header exists: `TimeoutLayer` shorter than `max_queue_wait`
/// answers it with an empty 408 (no JSON-RPC body, no id); with
/// `max_queue_wait` below it, the guard's own 503 + -32000 carrying the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_call_outlived_by_the_head_timeout_gets_an_empty_408() -> anyhow::Result<()> {
    let head = Duration::from_millis(500);
    let timeouts = Timeouts {
        response_head: head,
        ..TEST_TIMEOUTS
    };
    for (max_queue_wait, status) in [
        (head * 6, StatusCode::REQUEST_TIMEOUT),
        (head / 5, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let guard = IdGuardLayer::new()
            .on_duplicate(OnDuplicate::Queue)
            .max_queue_wait(max_queue_wait);
        let served = serve(app(guard.clone(), timeouts)).await?;
        let session = Session::open(&served.url).await?;
        let first = tokio::spawn(send(
            session.post_json(serde_json::from_str(&slow_echo("1", "first", 1500))?),
            OK_TIMEOUT,
        ));
        let stats = stats_when(&guard, WAIT_TIMEOUT, |stats| stats.in_flight_requests == 1).await;
        assert_eq!(stats.in_flight_requests, 1, "{stats:?}");

        let queued = send(
            session.post_json(serde_json::from_str(&slow_echo("1", "queued", 0))?),
            OK_TIMEOUT,
        )
        .await?;
        assert_eq!(queued.status, status, "{queued:?}");
        if status == StatusCode::REQUEST_TIMEOUT {
            assert_eq!(queued.body, "", "TimeoutLayer's 408 has no body");
        } else {
            let error: Value = serde_json::from_str(&queued.body)?;
            assert_eq!(error["id"], json!(1), "{error}");
            assert_eq!(error["error"]["code"], json!(-32000), "{error}");
        }
        let first = first.await??;
        assert_eq!(first.result(), Some(("first".to_owned(), "1".to_owned())));
    }
    Ok(())
}

/// Which layer answers a body over tower-http's `RequestBodyLimitLayer`,
/// outside and inside the guard, sent with `Content-Length` and chunked;
/// inside, also a chunked body the guard remaps (it reuses an id a refusal
/// left abandoned), which goes on rewritten, with a `Content-Length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_limits_either_side_of_the_guard() -> anyhow::Result<()> {
    const LIMIT: usize = 1024;
    // Each case its own id: a refusal by a layer inside the guard leaves its
    // id abandoned (the guard cannot tell it from the server's), and a reuse
    // would go remapped, with a rewritten `Content-Length`.
    let big = |id: &str| slow_echo(id, &"x".repeat(4 * LIMIT), 0);
    let mut seen = Vec::new();
    for outside in [true, false] {
        let guard = IdGuardLayer::new();
        let stats = guard.clone();
        let stack = if outside {
            axum::Router::new().nest_service(
                "/mcp",
                ServiceBuilder::new()
                    .layer(RequestBodyLimitLayer::new(LIMIT))
                    .layer(guard)
                    .service(mcp_service(TEST_TIMEOUTS)),
            )
        } else {
            axum::Router::new().nest_service(
                "/mcp",
                ServiceBuilder::new()
                    .layer(guard)
                    .layer(RequestBodyLimitLayer::new(LIMIT))
                    .service(mcp_service(TEST_TIMEOUTS)),
            )
        };
        let served = serve(stack).await?;
        let session = Session::open(&served.url).await?;
        // Inside, the third reuses `1`, abandoned by the first's refusal.
        let cases: &[(bool, &str)] = if outside {
            &[(false, "1"), (true, "2")]
        } else {
            &[(false, "1"), (true, "2"), (true, "1")]
        };
        for &(chunked, id) in cases {
            let request = session.post_json(Value::Null);
            let big = big(id);
            let request = if chunked {
                let body = big.clone().into_bytes();
                let chunks = futures::stream::iter(
                    body.chunks(256)
                        .map(|chunk| Ok::<_, std::io::Error>(chunk.to_vec()))
                        .collect::<Vec<_>>(),
                );
                request.body(reqwest::Body::wrap_stream(chunks))
            } else {
                request.body(big.clone())
            };
            let answer = send(request, OK_TIMEOUT).await?;
            seen.push((
                outside,
                chunked,
                answer.status,
                answer.headers.get("content-type").cloned(),
                answer.body,
            ));
        }
        let expected_remapped = if outside { 0 } else { 1 };
        assert_eq!(stats.stats().remapped_total, expected_remapped);
    }
    let plain = |body: &str| {
        (
            Some("text/plain; charset=utf-8".to_owned()),
            body.to_owned(),
        )
    };
    let table: Vec<_> = seen
        .into_iter()
        .map(|(outside, chunked, status, content_type, body)| {
            let content_type =
                content_type.and_then(|value| value.to_str().ok().map(str::to_owned));
            (outside, chunked, status, content_type, body)
        })
        .collect();
    let guard_400 = (
        Some("application/json".to_owned()),
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: the request body could not be read"}}"#.to_owned(),
    );
    let expected = [
        // Outside, Content-Length: tower-http refuses before the guard reads.
        (
            true,
            false,
            StatusCode::PAYLOAD_TOO_LARGE,
            plain("length limit exceeded"),
        ),
        // Outside, chunked: the guard's read fails.
        (true, true, StatusCode::BAD_REQUEST, guard_400),
        // Inside, Content-Length (the guard forwards it): tower-http again.
        (
            false,
            false,
            StatusCode::PAYLOAD_TOO_LARGE,
            plain("length limit exceeded"),
        ),
        // Inside, chunked: rmcp's own read fails, a 500 with a line of
        // text and no `Content-Type` (no JSON-RPC error).
        (
            false,
            true,
            StatusCode::INTERNAL_SERVER_ERROR,
            (
                None,
                "Failed to read request body: length limit exceeded".to_owned(),
            ),
        ),
        // Inside, chunked but remapped: the rewritten body goes with a
        // `Content-Length`, so tower-http refuses it as declared.
        (
            false,
            true,
            StatusCode::PAYLOAD_TOO_LARGE,
            plain("length limit exceeded"),
        ),
    ];
    assert_eq!(table.len(), expected.len());
    for ((outside, chunked, status, content_type, body), (o, c, s, (ct, b))) in
        table.into_iter().zip(expected)
    {
        assert_eq!((outside, chunked), (o, c));
        assert_eq!(
            (status, content_type, body),
            (s, ct, b),
            "outside {outside}, chunked {chunked}"
        );
    }
    Ok(())
}
