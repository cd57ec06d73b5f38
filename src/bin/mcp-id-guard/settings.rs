//! The library's settings from the command line: the Host/Origin policy,
//! the proxy, the guard and the server, each built from its flags.

use std::time::Duration;

use mcp_id_guard::protect::buffer::{BodyBudget, BodyBufferLayer};
use mcp_id_guard::protect::head::HeadLimitLayer;
use mcp_id_guard::protect::host::HostPolicy;
use mcp_id_guard::protect::pace::BodyPaceLayer;
use mcp_id_guard::proxy::Proxy;
use mcp_id_guard::server::{Server, ServerBuilder};
use mcp_id_guard::{IdGuardLayer, OnDuplicate};

use crate::args::{self, Args, Policy};

impl Args {
    /// The Host/Origin checks the flags ask for; an error when the flags
    /// leave the host names of a non-loopback listener unsaid.
    pub(crate) fn host_policy(&self) -> Result<HostPolicy, String> {
        let mut policy = HostPolicy::loopback();
        if self.allow_any_host {
            policy = policy.any_host();
        } else if !self.allowed_hosts.is_empty() {
            policy = policy
                .allowed_hosts(&self.allowed_hosts)
                .map_err(|error| format!("--allowed-hosts: {error}"))?;
        } else if !self.listen.ip().is_loopback() {
            return Err(format!(
                "listening on {}, which is not a loopback address: name the host names clients use \
                 with --allowed-hosts (DNS-rebinding protection), or pass --allow-any-host if \
                 something in front of the proxy checks them",
                self.listen
            ));
        }
        if self.allow_any_origin {
            policy = policy.any_origin();
        } else if !self.allowed_origins.is_empty() {
            policy = policy
                .allowed_origins(&self.allowed_origins)
                .map_err(|error| format!("--allowed-origins: {error}"))?;
        }
        Ok(policy)
    }

    /// The upstream's base URL: --upstream, or http://127.0.0.1:N for
    /// --upstream-port N.
    pub(crate) fn upstream_url(&self) -> String {
        match (&self.upstream, self.upstream_port) {
            (Some(url), _) => url.clone(),
            (None, Some(port)) => format!("http://127.0.0.1:{port}"),
            // clap requires one of them.
            (None, None) => String::new(),
        }
    }

    pub(crate) fn proxy(&self, max_upstream: usize) -> Result<Proxy, String> {
        Proxy::builder()
            .max_connections(Some(max_upstream))
            .connection_wait(self.upstream_queue_timeout)
            .pool_idle_timeout(self.pool_idle_timeout)
            .connect_timeout(self.connect_timeout)
            .response_timeout(enabled(self.upstream_response_timeout))
            .idle_timeout(enabled(self.upstream_idle_timeout))
            .preserve_host(self.preserve_host)
            .trust_forwarded(self.trust_forwarded)
            .build(&self.upstream_url())
            .map_err(|error| error.to_string())
    }

    pub(crate) fn on_duplicate(&self) -> OnDuplicate {
        match self.on_duplicate {
            Policy::Remap => OnDuplicate::Remap,
            Policy::Reject => OnDuplicate::Reject,
            Policy::Queue => OnDuplicate::Queue,
        }
    }

    pub(crate) fn guard(&self) -> Result<IdGuardLayer, String> {
        let guard = match &self.id_secret_file {
            Some(path) => IdGuardLayer::with_secret(args::read_id_secret(path)?),
            None => IdGuardLayer::new(),
        };
        Ok(guard
            .on_duplicate(self.on_duplicate())
            .reject_status(self.reject_status)
            .max_body_bytes(self.max_body_bytes)
            .max_in_flight_per_session(self.max_in_flight_per_session as usize)
            .max_queue_wait(self.max_queue_wait)
            .rewrite_all_ids(self.rewrite_all_ids)
            .abandoned_id_ttl(self.abandoned_id_ttl)
            .restart_window(self.restart_window.unwrap_or(self.abandoned_id_ttl))
            .max_session_id_bytes(self.max_session_id_bytes)
            .max_table_bytes(self.max_table_bytes))
    }

    pub(crate) fn server(&self, max_connections: usize) -> ServerBuilder {
        Server::builder()
            .header_read_timeout(enabled(self.header_read_timeout))
            .keep_alive_timeout(enabled(self.keep_alive_timeout))
            .send_timeout(enabled(self.send_timeout))
            .max_connections(max_connections)
            .max_requests_per_connection(Some(self.max_requests_per_connection))
            .client_resets(self.max_client_resets, self.client_reset_window)
            .grace_period(self.grace_period)
            .max_header_bytes(Some(self.max_header_bytes))
    }

    /// The admin listener's server: the client connections' keep-alive
    /// timeout and per-connection budgets, its own connection cap and head
    /// and send timeouts, and no metrics (its connections are not
    /// clients'). Idle admin connections make room at the cap (the
    /// library's default), as client connections do; the short timeouts
    /// free the slots of those that are not idle but never get anywhere.
    pub(crate) fn admin_server(&self) -> ServerBuilder {
        self.server(self.admin_max_connections())
            .header_read_timeout(enabled(self.admin_header_read_timeout))
            .send_timeout(enabled(self.admin_send_timeout))
    }

    /// `--admin-max-connections` as a count.
    pub(crate) fn admin_max_connections(&self) -> usize {
        usize::try_from(self.admin_max_connections).unwrap_or(usize::MAX)
    }

    /// The request body's pace: its longest pause, its slowest rate.
    pub(crate) fn pace(&self) -> BodyPaceLayer {
        BodyPaceLayer::new()
            .idle_timeout(enabled(self.request_body_timeout))
            .min_rate(self.min_request_body_rate)
            .grace(self.request_body_grace)
    }

    /// Request bodies read whole before they go upstream, under the size
    /// cap, the shared memory budget, each client address's share (once the
    /// layer is made [`for_client`](BodyBufferLayer::for_client)) and each
    /// connection's share.
    pub(crate) fn body_buffer(&self) -> BodyBufferLayer {
        BodyBufferLayer::new(
            BodyBudget::new(self.max_body_memory_bytes)
                .per_client(self.max_body_memory_per_client()),
        )
        .max_body_bytes(self.max_body_bytes)
        .per_connection(
            self.max_body_memory_per_connection
                .unwrap_or(self.max_body_bytes),
        )
    }

    /// `--max-body-memory-per-client`, half the budget by default.
    pub(crate) fn max_body_memory_per_client(&self) -> usize {
        self.max_body_memory_per_client
            .unwrap_or(BodyBudget::default_share(self.max_body_memory_bytes))
    }

    /// The request head limit (none when `--max-header-bytes 0`: hyper's
    /// own read buffer bounds the head then).
    pub(crate) fn head_limit(&self) -> HeadLimitLayer {
        HeadLimitLayer::new(match self.max_header_bytes {
            0 => usize::MAX,
            max => max,
        })
    }

    /// The startup lines about the limits in force.
    pub(crate) fn log_limits(&self, max_connections: usize, descriptors: u64, max_upstream: usize) {
        tracing::info!(
            "client connections: at most {max_connections} open (descriptor limit {descriptors}); \
             upstream connections: at most {max_upstream}; request heads: at most {} bytes; \
             timeouts: request head {}, request body pause {}, blocked send {}, keep-alive {}, \
             upstream response {}, upstream pause {}; request bodies: at least {} after {:?}, \
             at most {} bytes each, {} bytes held at once ({} per connection, {} of large bodies \
             per client address)",
            match self.max_header_bytes {
                0 => "hyper's default".to_owned(),
                max => max.to_string(),
            },
            shown(self.header_read_timeout),
            shown(self.request_body_timeout),
            shown(self.send_timeout),
            shown(self.keep_alive_timeout),
            shown(self.upstream_response_timeout),
            shown(self.upstream_idle_timeout),
            match self.min_request_body_rate {
                0 => "any rate".to_owned(),
                rate => format!("{rate} B/s"),
            },
            self.request_body_grace,
            self.max_body_bytes,
            self.max_body_memory_bytes,
            self.max_body_memory_per_connection
                .unwrap_or(self.max_body_bytes),
            self.max_body_memory_per_client(),
        );
        tracing::info!(
            "per client connection: at most {} requests, at most {} HTTP/2 streams reset by the client \
             before their response",
            match self.max_requests_per_connection {
                0 => "any number of".to_owned(),
                max => max.to_string(),
            },
            if self.max_client_resets > 0 && !self.client_reset_window.is_zero() {
                format!("{} per {:?}", self.max_client_resets, self.client_reset_window)
            } else {
                "any number of".to_owned()
            },
        );
    }

    /// What the startup lines say about the duplicate-id policy.
    pub(crate) fn policy_name(&self) -> String {
        let mut name = match self.on_duplicate {
            Policy::Reject => format!("reject with {}", self.reject_status),
            Policy::Queue => format!("queue for up to {:?}", self.max_queue_wait),
            Policy::Remap => "remap".to_owned(),
        };
        if self.rewrite_all_ids {
            name.push_str("; every id rewritten");
        }
        name
    }
}

/// A duration flag where `0` turns the limit off.
pub(crate) fn enabled(limit: Duration) -> Option<Duration> {
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
