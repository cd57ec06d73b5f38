//! `mcp_id_guard._core`: the binding the `IdGuard` ASGI middleware drives.
//!
//! Every rule is the crate's (`mcp_id_guard::core`); this file only turns
//! Python's values into HTTP types and back. All calls are synchronous and
//! short, and hold the GIL: Python does all the awaiting (anyio, so asyncio
//! and trio alike), and a queued request's wake-up is a token the middleware
//! reads with `Core.take_woken()`, never a call into Python from Rust.
#![forbid(unsafe_code)]

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use mcp_id_guard::core::{Action, Core as GuardCore, Passage};
use mcp_id_guard::protect::buffer::BodyBudget;
use mcp_id_guard::{IdGuardLayer, OnDuplicate};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// ASGI headers: `(name, value)` byte pairs.
type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// The guard's rules and session table, shared by every request of one
/// `IdGuard`.
#[pyclass(module = "mcp_id_guard._core", frozen)]
struct Core {
    core: GuardCore,
}

#[pymethods]
impl Core {
    #[new]
    #[pyo3(signature = (
        *,
        on_duplicate = "remap",
        max_body_bytes = None,
        max_queue_wait = None,
        abandoned_id_ttl = None,
        max_in_flight_per_session = None,
        max_session_id_bytes = None,
        max_table_bytes = None,
        max_body_memory = None,
        max_body_memory_per_client = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        on_duplicate: &str,
        max_body_bytes: Option<usize>,
        max_queue_wait: Option<f64>,
        abandoned_id_ttl: Option<f64>,
        max_in_flight_per_session: Option<usize>,
        max_session_id_bytes: Option<usize>,
        max_table_bytes: Option<usize>,
        max_body_memory: Option<usize>,
        max_body_memory_per_client: Option<usize>,
    ) -> PyResult<Self> {
        let policy = match on_duplicate {
            "remap" => OnDuplicate::Remap,
            "reject" => OnDuplicate::Reject,
            "queue" => OnDuplicate::Queue,
            other => {
                return Err(PyValueError::new_err(format!(
                    "on_duplicate must be \"remap\", \"reject\" or \"queue\", not {other:?}"
                )))
            }
        };
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .map_err(|_| PyValueError::new_err(format!("{name} must be seconds >= 0")))
        };
        let mut layer = IdGuardLayer::new().on_duplicate(policy);
        if let Some(limit) = max_body_bytes {
            layer = layer.max_body_bytes(limit);
        }
        if let Some(wait) = max_queue_wait {
            layer = layer.max_queue_wait(seconds("max_queue_wait", wait)?);
        }
        if let Some(ttl) = abandoned_id_ttl {
            layer = layer.abandoned_id_ttl(seconds("abandoned_id_ttl", ttl)?);
        }
        if let Some(limit) = max_in_flight_per_session {
            layer = layer.max_in_flight_per_session(limit);
        }
        if let Some(limit) = max_session_id_bytes {
            layer = layer.max_session_id_bytes(limit);
        }
        if let Some(limit) = max_table_bytes {
            layer = layer.max_table_bytes(limit);
        }
        // What the bodies being read may hold at once (uvicorn and hypercorn
        // bound none): by default what the proxy holds.
        let limit = max_body_memory.unwrap_or(BodyBudget::DEFAULT_MAX_BYTES);
        let share = max_body_memory_per_client.unwrap_or(BodyBudget::default_share(limit));
        let core = GuardCore::new(&layer).with_budget(BodyBudget::new(limit).per_client(share));
        Ok(Self { core })
    }

    /// Seconds a queued duplicate may wait: the driver times the wait.
    #[getter]
    fn max_queue_wait(&self) -> f64 {
        self.core.max_queue_wait().as_secs_f64()
    }

    /// The table's counters, by the names of `mcp_id_guard::Stats`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.core.stats();
        let dict = PyDict::new(py);
        for (name, value) in [
            ("in_flight_requests", stats.in_flight_requests as u64),
            ("in_flight_sessions", stats.in_flight_sessions as u64),
            ("abandoned_ids", stats.abandoned_ids as u64),
            ("passed_total", stats.passed_total),
            ("remapped_total", stats.remapped_total),
            ("rejected_total", stats.rejected_total),
            ("queued_total", stats.queued_total),
            ("restored_total", stats.restored_total),
            ("cancelled_total", stats.cancelled_total),
        ] {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }

    /// One HTTP request's way through the guard, from its method and ASGI
    /// headers.
    #[pyo3(signature = (method, headers, client = None))]
    fn exchange(&self, method: &str, headers: Headers, client: Option<&str>) -> Exchange {
        let client = client.and_then(|client| client.parse::<IpAddr>().ok());
        let passage = match (Method::from_bytes(method.as_bytes()), header_map(&headers)) {
            (Ok(method), Some(map)) => match client {
                Some(client) => self.core.start_from(&method, map, client),
                None => self.core.start(&method, map),
            },
            // A head the `http` crate does not take (a control byte in a
            // value, which some ASGI servers pass): in a session the guard
            // cannot read it as the server will, so it answers itself;
            // outside one nothing is tracked, and it goes on untouched.
            _ if headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case(b"mcp-session-id")) =>
            {
                self.core.refuse_head()
            }
            _ => self.core.pass(),
        };
        let stream = passage.action() == Action::Forward;
        Exchange {
            passage: Mutex::new(passage),
            stream,
        }
    }

    /// Tokens of waiting exchanges whose turn may have come since the last
    /// call.
    fn take_woken(&self) -> Vec<u64> {
        self.core.take_woken()
    }
}

/// One request's way through the guard; see `_core.pyi`.
#[pyclass(module = "mcp_id_guard._core", frozen)]
struct Exchange {
    passage: Mutex<Passage>,
    /// Forwarded on its head (a `GET` stream): its body goes on as it came.
    stream: bool,
}

impl Exchange {
    fn passage(&self) -> std::sync::MutexGuard<'_, Passage> {
        self.passage
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn named(&self, action: Action) -> &'static str {
        match action {
            Action::Pass => "pass",
            Action::Read => "read",
            Action::Forward if self.stream => "stream",
            Action::Forward => "forward",
            Action::Answer => "answer",
            Action::Wait => "wait",
            Action::Respond => "respond",
            _ => "closed",
        }
    }
}

#[pymethods]
impl Exchange {
    /// What the driver does next.
    #[getter]
    fn action(&self) -> &'static str {
        let action = self.passage().action();
        self.named(action)
    }

    /// While waiting: the token `Core.take_woken()` reports.
    #[getter]
    fn token(&self) -> Option<u64> {
        self.passage().token()
    }

    fn feed(&self, chunk: &[u8]) -> bool {
        self.passage().feed(Bytes::copy_from_slice(chunk))
    }

    fn admit(&self) -> &'static str {
        let action = self.passage().admit();
        self.named(action)
    }

    fn poll_turn(&self) -> &'static str {
        let action = self.passage().poll_turn();
        self.named(action)
    }

    fn time_out(&self) {
        self.passage().time_out();
    }

    fn request_headers(&self) -> Headers {
        self.passage()
            .request_headers()
            .map(header_list)
            .unwrap_or_default()
    }

    fn request_body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let body = self.passage().take_request_body().unwrap_or_default();
        PyBytes::new(py, &body)
    }

    fn answer<'py>(&self, py: Python<'py>) -> PyResult<(u16, Headers, Bound<'py, PyBytes>)> {
        let passage = self.passage();
        let Some((status, headers, body)) = passage.answer() else {
            return Err(PyValueError::new_err(
                "the exchange has no answer of the guard's",
            ));
        };
        Ok((
            status.as_u16(),
            header_list(headers),
            PyBytes::new(py, &body),
        ))
    }

    /// The app's response head: the headers to send instead (the app's,
    /// less those the guard removed).
    fn response_start(&self, status: u16, headers: Headers) -> PyResult<Headers> {
        let status = StatusCode::from_u16(status)
            .map_err(|_| PyValueError::new_err(format!("not an HTTP status: {status}")))?;
        let mut map = HeaderMap::new();
        for (name, value) in &headers {
            // A header the `http` crate does not take is none the guard
            // reads: it goes on as the app wrote it.
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                map.append(name, value);
            }
        }
        let before: Vec<HeaderName> = map.keys().cloned().collect();
        self.passage().respond(status, &mut map);
        // Only what the guard removed is dropped; the rest keeps its order.
        let removed: Vec<HeaderName> = before
            .into_iter()
            .filter(|name| !map.contains_key(name))
            .collect();
        Ok(headers
            .into_iter()
            .filter(|(name, _)| {
                HeaderName::from_bytes(name).map_or(true, |name| !removed.contains(&name))
            })
            .collect())
    }

    fn response_body<'py>(
        &self,
        py: Python<'py>,
        chunk: &[u8],
        more_body: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let out = self
            .passage()
            .body(Bytes::copy_from_slice(chunk), more_body)
            .map_err(|error| PyRuntimeError::new_err(error.to_string()))?;
        Ok(PyBytes::new(py, &out))
    }

    fn close(&self) {
        self.passage().close();
    }
}

/// ASGI headers as a map; `None` if one is not a valid HTTP field.
fn header_map(headers: &Headers) -> Option<HeaderMap> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        map.append(
            HeaderName::from_bytes(name).ok()?,
            HeaderValue::from_bytes(value).ok()?,
        );
    }
    Some(map)
}

fn header_list(map: &HeaderMap) -> Headers {
    map.iter()
        .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
        .collect()
}

/// The `mcp_id_guard._core` module.
#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Core>()?;
    module.add_class::<Exchange>()?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
