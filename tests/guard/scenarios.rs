//! The shared scenario table (`tests/scenarios/answers.json`): requests the
//! guard answers itself, and the exact answer each gets. Every face runs
//! it and must answer byte for byte alike: the tower service and the
//! sans-IO core here, the Python ASGI middleware in `python/tests`.
//!
//! In a scenario every request but the last is admitted and held in flight
//! (the server never answers it); the last one gets the guard's own answer.
//! `UPDATE_SCENARIOS=1` rewrites the answers from the tower face.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use mcp_id_guard::core::{Action, Core};
use mcp_id_guard::guard::GuardRequestBody;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use serde::{Deserialize, Serialize};
use tower::{Layer, Service};

const TABLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scenarios/answers.json");

#[derive(Debug, Serialize, Deserialize)]
struct Scenario {
    name: String,
    on_duplicate: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_body_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_session_id_bytes: Option<usize>,
    requests: Vec<Sent>,
    answer: Answer,
}

#[derive(Debug, Serialize, Deserialize)]
struct Sent {
    method: String,
    headers: Vec<(String, String)>,
    body: String,
}

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Scenario {
    fn layer(&self) -> IdGuardLayer {
        let policy = match self.on_duplicate.as_str() {
            "remap" => OnDuplicate::Remap,
            "reject" => OnDuplicate::Reject,
            "queue" => OnDuplicate::Queue,
            other => panic!("{}: no policy {other}", self.name),
        };
        let mut layer = IdGuardLayer::new().on_duplicate(policy);
        if let Some(limit) = self.max_body_bytes {
            layer = layer.max_body_bytes(limit);
        }
        if let Some(limit) = self.max_session_id_bytes {
            layer = layer.max_session_id_bytes(limit);
        }
        layer
    }
}

impl Sent {
    fn method(&self) -> Method {
        Method::from_bytes(self.method.as_bytes()).unwrap()
    }

    fn headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in &self.headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }
}

fn answer(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Answer {
    Answer {
        status: status.as_u16(),
        headers: headers
            .iter()
            .filter(|(name, _)| *name != http::header::CONTENT_LENGTH)
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect(),
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// The tower face: held requests are polled once (read, admitted, handed
/// to a server that never answers); the last one's answer is collected.
fn tower_answer(scenario: &Scenario) -> Answer {
    let server = tower::service_fn(|_: Request<GuardRequestBody<Full<Bytes>>>| {
        std::future::pending::<Result<Response<Full<Bytes>>, std::convert::Infallible>>()
    });
    let mut guard = scenario.layer().layer(server);
    let mut cx = Context::from_waker(Waker::noop());
    let mut held = Vec::new();
    let (last, before) = scenario.requests.split_last().unwrap();
    for sent in before {
        let mut request = Request::new(Full::new(Bytes::from(sent.body.clone())));
        *request.method_mut() = sent.method();
        *request.headers_mut() = sent.headers();
        let mut future = Box::pin(guard.call(request));
        assert!(
            future.as_mut().poll(&mut cx).is_pending(),
            "{}: a held request reaches the server",
            scenario.name
        );
        held.push(future);
    }
    let mut request = Request::new(Full::new(Bytes::from(last.body.clone())));
    *request.method_mut() = last.method();
    *request.headers_mut() = last.headers();
    let future = pin!(guard.call(request));
    let Poll::Ready(Ok(response)) = future.poll(&mut cx) else {
        panic!(
            "{}: the guard answers the last request itself",
            scenario.name
        )
    };
    let (parts, body) = response.into_parts();
    let Poll::Ready(Ok(collected)) = pin!(body.collect()).poll(&mut cx) else {
        panic!("{}: the guard's answer is whole", scenario.name)
    };
    answer(parts.status, &parts.headers, &collected.to_bytes())
}

/// The sans-IO core, driven as the Python face drives it.
fn core_answer(scenario: &Scenario) -> Answer {
    let core = Core::new(&scenario.layer());
    let mut held = Vec::new();
    let (last, before) = scenario.requests.split_last().unwrap();
    for sent in before {
        let mut passage = core.start(&sent.method(), sent.headers());
        if passage.action() == Action::Read {
            assert!(passage.feed(Bytes::from(sent.body.clone())));
            passage.admit();
        }
        assert_eq!(
            passage.action(),
            Action::Forward,
            "{}: a held request reaches the server",
            scenario.name
        );
        held.push(passage);
    }
    let mut passage = core.start(&last.method(), last.headers());
    if passage.action() == Action::Read && passage.feed(Bytes::from(last.body.clone())) {
        passage.admit();
    }
    let (status, headers, body) = passage
        .answer()
        .unwrap_or_else(|| panic!("{}: the guard answers the last request", scenario.name));
    answer(status, headers, &body)
}

#[test]
fn every_face_answers_the_scenario_table_alike() {
    let text = std::fs::read_to_string(TABLE).unwrap();
    let mut scenarios: Vec<Scenario> = serde_json::from_str(&text).unwrap();
    assert!(scenarios.len() >= 8, "the table has its scenarios");
    if std::env::var_os("UPDATE_SCENARIOS").is_some() {
        for scenario in &mut scenarios {
            scenario.answer = tower_answer(scenario);
        }
        let text = serde_json::to_string_pretty(&scenarios).unwrap() + "\n";
        std::fs::write(TABLE, text).unwrap();
    }
    for scenario in &scenarios {
        assert_eq!(
            tower_answer(scenario),
            scenario.answer,
            "tower: {}",
            scenario.name
        );
        assert_eq!(
            core_answer(scenario),
            scenario.answer,
            "core: {}",
            scenario.name
        );
    }
}
