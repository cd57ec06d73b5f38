//! [`OtlpConfig`]: where and how the exporter sends spans, read from the
//! standard `OTEL_*` environment variables.

use std::fmt;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::Uri;

use crate::protect::metrics::Metrics;
use crate::trace::legacy::context::TraceParent;
use crate::wire::percent_byte;

/// How the exporter sends spans: endpoint, headers, resource, batching and
/// sampling. Read from the environment with [`from_env`](Self::from_env)
/// (or from any lookup with [`from_vars`](Self::from_vars)).
///
/// | variable | default | |
/// |---|---|---|
/// | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | | used as is |
/// | `OTEL_EXPORTER_OTLP_ENDPOINT` | | `/v1/traces` appended |
/// | `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` | `http/protobuf` | the only one supported |
/// | `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS` | | `k=v,k2=v2`, percent-decoded; the traces ones win |
/// | `OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT` | 10000 ms | each export's bound, with `OTEL_BSP_EXPORT_TIMEOUT` |
/// | `OTEL_EXPORTER_OTLP_(TRACES_)COMPRESSION` | `none` | `gzip` is not supported |
/// | `OTEL_SERVICE_NAME` | `mcp-id-guard` | resource `service.name` |
/// | `OTEL_RESOURCE_ATTRIBUTES` | | `k=v,…`, percent-decoded |
/// | `OTEL_BSP_MAX_QUEUE_SIZE` | 2048 | spans waiting; more are dropped |
/// | `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` | 512 | spans per export (at most the queue size) |
/// | `OTEL_BSP_SCHEDULE_DELAY` | 5000 ms | between exports |
/// | `OTEL_BSP_EXPORT_TIMEOUT` | 30000 ms | each export's bound, with the OTLP timeout |
/// | `OTEL_TRACES_SAMPLER` (`_ARG`) | `parentbased_always_on` | `always_on`, `always_off`, `traceidratio`, `parentbased_*` |
/// | `OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER` | | `true`, `none`: no traces |
///
/// Traces are on only when an endpoint variable is set (or
/// `OTEL_TRACES_EXPORTER=otlp`, then to `http://localhost:4318/v1/traces`):
/// an unconfigured process sends nothing anywhere. The endpoint must be
/// plain `http://`: point it at a local collector (which may forward over
/// TLS or gRPC). Header values are never logged nor shown by `Debug`.
#[derive(Clone)]
pub struct OtlpConfig {
    pub(crate) endpoint: Uri,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) resource: Vec<(String, String)>,
    pub(crate) max_queue_size: usize,
    pub(crate) max_export_batch_size: usize,
    pub(crate) schedule_delay: Duration,
    pub(crate) export_timeout: Duration,
    pub(crate) sampler: Sampler,
    pub(crate) metrics: Option<Metrics>,
}

impl fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint)
            .field("header_names", &header_names)
            .field("resource", &self.resource)
            .field("max_queue_size", &self.max_queue_size)
            .field("max_export_batch_size", &self.max_export_batch_size)
            .field("schedule_delay", &self.schedule_delay)
            .field("export_timeout", &self.export_timeout)
            .field("sampler", &self.sampler)
            .finish()
    }
}

/// A setting the exporter cannot follow: the process should not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn error(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Follow the caller's sampled flag when it sent a valid `traceparent`.
    parent_based: bool,
    /// For a trace the guard starts: record it when the trace id's low 56
    /// bits are below this (0: never, 2^56: always).
    threshold: u64,
}

const ALL: u64 = 1 << 56;

impl Sampler {
    /// Whether a request's span is recorded: the caller's decision when
    /// parent-based and it sent one, else the root rule on the trace id
    /// (`traceidratio` compares its lowest 56 bits, the randomness W3C
    /// Trace Context level 2 asks for).
    pub(crate) fn sampled(&self, parent: Option<&TraceParent>, trace_id: &[u8; 16]) -> bool {
        match parent {
            Some(parent) if self.parent_based => parent.sampled(),
            _ => {
                let mut low = [0; 8];
                low[1..].copy_from_slice(&trace_id[9..]);
                u64::from_be_bytes(low) < self.threshold
            }
        }
    }

    fn parse(name: Option<&str>, arg: Option<&str>) -> Result<Self, ConfigError> {
        let ratio = || -> Result<u64, ConfigError> {
            let Some(arg) = arg else { return Ok(ALL) };
            match arg.trim().parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok((ratio * ALL as f64) as u64),
                _ => Err(error(format!(
                    "OTEL_TRACES_SAMPLER_ARG: {arg:?} is no ratio between 0 and 1"
                ))),
            }
        };
        let (parent_based, threshold) = match name.map(str::trim).unwrap_or("parentbased_always_on")
        {
            "always_on" => (false, ALL),
            "always_off" => (false, 0),
            "traceidratio" => (false, ratio()?),
            "parentbased_always_on" => (true, ALL),
            "parentbased_always_off" => (true, 0),
            "parentbased_traceidratio" => (true, ratio()?),
            other => {
                return Err(error(format!(
                    "OTEL_TRACES_SAMPLER: {other:?} is not supported (always_on, always_off, \
                     traceidratio, parentbased_always_on, parentbased_always_off, \
                     parentbased_traceidratio)"
                )))
            }
        };
        Ok(Self {
            parent_based,
            threshold,
        })
    }
}

impl OtlpConfig {
    /// Reads the process environment; see [`from_vars`](Self::from_vars).
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the `OTEL_*` variables through `var` (the process environment
    /// in [`from_env`](Self::from_env), a map in tests). `Ok(None)`: traces
    /// are off (no endpoint set, `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`); an error for any setting the exporter
    /// cannot follow (another protocol, `https`, compression, an unknown
    /// sampler, a malformed number or header).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let explicit = match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None => false,
            Some("none") => return Ok(None),
            Some("otlp") => true,
            Some(other) => {
                return Err(error(format!(
                    "OTEL_TRACES_EXPORTER: {other:?} is not supported (otlp or none)"
                )))
            }
        };
        let endpoint = match (
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            var("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(traces), _) => traces.trim().to_owned(),
            (None, Some(base)) => format!("{}/v1/traces", base.trim().trim_end_matches('/')),
            (None, None) if explicit => "http://localhost:4318/v1/traces".to_owned(),
            (None, None) => return Ok(None),
        };
        let endpoint = endpoint_uri(&endpoint)?;
        let either = |name: &str| {
            var(&format!("OTEL_EXPORTER_OTLP_TRACES_{name}"))
                .or_else(|| var(&format!("OTEL_EXPORTER_OTLP_{name}")))
        };
        if let Some(protocol) = either("PROTOCOL") {
            if protocol.trim() != "http/protobuf" {
                return Err(error(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL: {:?} is not supported: only http/protobuf \
                     (point it at a local collector)",
                    protocol.trim()
                )));
            }
        }
        if let Some(compression) = either("COMPRESSION") {
            if compression.trim() != "none" {
                return Err(error(format!(
                    "OTEL_EXPORTER_OTLP_COMPRESSION: {:?} is not supported: only none",
                    compression.trim()
                )));
            }
        }
        let mut headers = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            for (key, value) in pairs(name, var(name).as_deref())? {
                let key = HeaderName::from_bytes(key.as_bytes())
                    .map_err(|_| error(format!("{name}: {key:?} is no header name")))?;
                let value = HeaderValue::from_str(&value)
                    .map_err(|_| error(format!("{name}: the value of {key} is no header value")))?;
                // The traces-specific variable, read last, wins.
                headers.retain(|(existing, _)| *existing != key);
                headers.push((key, value));
            }
        }
        let mut resource = pairs(
            "OTEL_RESOURCE_ATTRIBUTES",
            var("OTEL_RESOURCE_ATTRIBUTES").as_deref(),
        )?;
        let service = var("OTEL_SERVICE_NAME").map(|name| name.trim().to_owned());
        if service.is_some() || !resource.iter().any(|(key, _)| key == "service.name") {
            resource.retain(|(key, _)| key != "service.name");
            let name = service.unwrap_or_else(|| "mcp-id-guard".to_owned());
            resource.insert(0, ("service.name".to_owned(), name));
        }
        let number = |name: &str, default: u64| -> Result<u64, ConfigError> {
            match var(name) {
                None => Ok(default),
                Some(value) => value
                    .trim()
                    .parse()
                    .map_err(|_| error(format!("{name}: {:?} is no whole number", value.trim()))),
            }
        };
        let max_queue_size = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
        if max_queue_size == 0 {
            return Err(error("OTEL_BSP_MAX_QUEUE_SIZE: must be at least 1"));
        }
        let max_export_batch_size =
            number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.clamp(1, max_queue_size);
        let schedule_delay = number("OTEL_BSP_SCHEDULE_DELAY", 5000)?;
        let otlp_timeout = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
            Some(_) => number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?,
            None => number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
        };
        let export_timeout = otlp_timeout.min(number("OTEL_BSP_EXPORT_TIMEOUT", 30_000)?);
        let sampler = Sampler::parse(
            var("OTEL_TRACES_SAMPLER").as_deref(),
            var("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        )?;
        Ok(Some(Self {
            endpoint,
            headers,
            resource,
            max_queue_size: usize::try_from(max_queue_size).unwrap_or(usize::MAX),
            max_export_batch_size: usize::try_from(max_export_batch_size).unwrap_or(usize::MAX),
            // A zero delay would spin; a zero timeout would fail every export.
            schedule_delay: Duration::from_millis(schedule_delay.max(1)),
            export_timeout: Duration::from_millis(export_timeout.max(1)),
            sampler,
            metrics: None,
        }))
    }

    /// Counts exported and dropped spans into `metrics` too
    /// (`mcp_id_guard_trace_spans_exported_total`,
    /// `mcp_id_guard_trace_spans_dropped_total`), for a `/metrics` endpoint.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Where spans are sent.
    pub fn endpoint(&self) -> &Uri {
        &self.endpoint
    }

    /// The sampler requests are traced by.
    pub fn sampler(&self) -> Sampler {
        self.sampler
    }
}

/// The endpoint, if the exporter can send to it: `http://host[:port]/path`.
fn endpoint_uri(text: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = text
        .parse()
        .map_err(|_| error(format!("OTLP endpoint {text:?} is no URL")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(error(
                "OTLP endpoint: https is not supported; point it at a local collector over \
                 http:// (the collector may forward over TLS)",
            ))
        }
        _ => return Err(error(format!("OTLP endpoint {text:?} is no http:// URL"))),
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    if uri.host().is_none_or(str::is_empty) || authority.contains('@') {
        return Err(error(
            "OTLP endpoint: needs a host, and no user or password in the URL (use \
             OTEL_EXPORTER_OTLP_HEADERS)",
        ));
    }
    Ok(uri)
}

/// `k=v,k2=v2` (W3C baggage style, as `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES` are written): trimmed, percent-decoded. An
/// error names the variable and the key, never a value.
fn pairs(name: &str, text: Option<&str>) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let mut pairs = Vec::new();
    for (index, item) in text.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(error(format!("{name}: item {} has no `=`", index + 1)));
        };
        let key = percent_decoded(key.trim())
            .filter(|key| !key.is_empty())
            .ok_or_else(|| error(format!("{name}: item {} has no valid key", index + 1)))?;
        let value = percent_decoded(value.trim())
            .ok_or_else(|| error(format!("{name}: the value of {key:?} is not valid")))?;
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// `%XX` escapes decoded; `None` for a broken escape or bytes that are not
/// UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let escape = bytes.get(at + 1..at + 3)?;
            out.push(percent_byte(escape[0], escape[1])?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OtlpConfig::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn no_endpoint_no_traces() {
        assert!(config(&[]).unwrap().is_none());
        assert!(config(&[("OTEL_SERVICE_NAME", "x")]).unwrap().is_none());
    }

    #[test]
    fn defaults_are_the_standard_ones() {
        let config = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(config.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(config.max_queue_size, 2048);
        assert_eq!(config.max_export_batch_size, 512);
        assert_eq!(config.schedule_delay, Duration::from_millis(5000));
        assert_eq!(config.export_timeout, Duration::from_millis(10_000));
        assert_eq!(
            config.resource,
            [("service.name".to_owned(), "mcp-id-guard".to_owned())]
        );
        assert_eq!(
            config.sampler,
            Sampler::parse(Some("parentbased_always_on"), None).unwrap()
        );
        let explicit = super::OtlpConfig::from_vars(|name| {
            (name == "OTEL_TRACES_EXPORTER").then(|| "otlp".to_owned())
        });
        assert_eq!(
            explicit.unwrap().unwrap().endpoint,
            "http://localhost:4318/v1/traces"
        );
    }

    #[test]
    fn the_traces_endpoint_is_used_as_is_and_settings_are_read() {
        let config = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:9/custom",
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20one, x-a = 1",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "Authorization=Bearer%20two",
            ),
            ("OTEL_SERVICE_NAME", "front"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=lost,deployment.environment=prod%2C1",
            ),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_BSP_EXPORT_TIMEOUT", "300"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(config.endpoint, "http://127.0.0.1:9/custom");
        let headers: Vec<(&str, &str)> = config
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(headers, [("x-a", "1"), ("authorization", "Bearer two")]);
        assert_eq!(
            config.resource,
            [
                ("service.name".to_owned(), "front".to_owned()),
                ("deployment.environment".to_owned(), "prod,1".to_owned())
            ]
        );
        assert_eq!(config.max_queue_size, 4);
        assert_eq!(config.max_export_batch_size, 4);
        assert_eq!(config.schedule_delay, Duration::from_millis(20));
        assert_eq!(config.export_timeout, Duration::from_millis(300));
        assert!(!config.sampler.parent_based);
        assert_eq!(config.sampler.threshold, ALL / 2);
        let debug = format!("{config:?}");
        assert!(!debug.contains("Bearer"), "{debug}");
    }

    #[test]
    fn off_switches() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        assert!(config(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")])
            .unwrap()
            .is_none());
        assert!(config(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")])
            .unwrap()
            .is_none());
        assert!(config(&[endpoint, ("OTEL_SDK_DISABLED", "false")])
            .unwrap()
            .is_some());
    }

    #[test]
    fn what_the_exporter_cannot_follow_is_an_error_that_shows_no_secret() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let mut cases: Vec<Vec<(&str, &str)>> =
            ["https://c:4318", "c:4318", "http://user:secret@c:4318"]
                .into_iter()
                .map(|url| vec![("OTEL_EXPORTER_OTLP_ENDPOINT", url)])
                .collect();
        cases.push(vec![
            endpoint,
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ]);
        let settings = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "5s"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=secret%zz"),
            // A sign is no hex digit (`from_str_radix` would take "+f").
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=secret%+f"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x=secret\u{1}"),
        ];
        cases.extend(settings.into_iter().map(|setting| vec![endpoint, setting]));
        for vars in cases {
            let failed = config(&vars).expect_err(&format!("{vars:?}"));
            assert!(!failed.to_string().contains("secret"), "{failed}");
        }
    }

    #[test]
    fn parent_based_sampling_follows_the_caller() {
        let parent = |flags| TraceParent {
            trace_id: [1; 16],
            parent_id: [2; 8],
            flags,
        };
        let on = Sampler::parse(None, None).unwrap();
        assert!(on.sampled(None, &[0xff; 16]));
        assert!(on.sampled(Some(&parent(1)), &[1; 16]));
        assert!(!on.sampled(Some(&parent(0)), &[1; 16]));
        let off = Sampler::parse(Some("always_off"), None).unwrap();
        assert!(!off.sampled(Some(&parent(1)), &[0; 16]));
        let half = Sampler::parse(Some("traceidratio"), Some("0.5")).unwrap();
        let mut low = [0; 16];
        low[9] = 0x7f;
        assert!(half.sampled(None, &low));
        low[9] = 0x80;
        assert!(!half.sampled(None, &low));
    }
}
