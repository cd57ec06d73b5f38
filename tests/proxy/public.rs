//! The public-deployment recipe (README.md, "Public deployment";
//! `deploy/public/haproxy.cfg`), as far as loopback allows: a real HAProxy
//! run from the committed config terminates TLS (a certificate for
//! `mcp.example.test` generated now) in front of `mcp-id-guard
//! --allowed-hosts mcp.example.test --trust-forwarded`, which runs the
//! server itself (`--upstream-port N -- COMMAND`: a few lines of Python that
//! answer with the forwarding headers they received). Three loopback
//! addresses stand for three hosts: the client connects from 127.0.0.2,
//! HAProxy forwards from 127.0.0.3, the guard listens on 127.0.0.1.
//!
//! Checked: a request naming the public host passes and the server sees the
//! client's address first in `X-Forwarded-For` (then HAProxy's), `https` and
//! the public host, and none of what the client forged in those headers; a
//! request naming another host is refused by the guard (421, JSON-RPC).
//! The control: without `--trust-forwarded` the server sees HAProxy as the
//! client, over `http`.
//!
//! Like the replica tests, they need HAProxy: without it each writes one
//! `skipped: ...` line and passes, unless `MCP_ID_GUARD_REQUIRE_HAPROXY=1`
//! (`.ci/run`) makes that a failure.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio_rustls::rustls;

use crate::replicas::skip_without_haproxy_for;
use crate::support::process::Guard;
use crate::support::OK_TIMEOUT;

/// The committed recipe, exactly as operators get it.
const TEMPLATE: &str = include_str!("../../deploy/public/haproxy.cfg");
/// The public name the certificate and `--allowed-hosts` carry.
const PUBLIC_HOST: &str = "mcp.example.test";
/// Where "the internet" connects from.
const CLIENT_IP: &str = "127.0.0.2";
/// Where the TLS terminator forwards from.
const TERMINATOR_IP: &str = "127.0.0.3";

/// The server the guard runs: answers every POST with the forwarding
/// headers it received, as JSON.
const ECHO_SERVER: &str = r#"
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        seen = {name: self.headers.get(name) for name in
                ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "forwarded")}
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"#;

/// A loopback port nothing listens on (bound and released).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The guard with `extra` flags, running the echo server as its child.
async fn guard(extra: &[&str]) -> anyhow::Result<Guard> {
    let port = free_port()?.to_string();
    let mut args = vec!["--upstream-port", &port, "--allowed-hosts", PUBLIC_HOST];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "python3", "-c", ECHO_SERVER]);
    Guard::start(&args).await
}

/// HAProxy from the committed config (killed on drop, its files removed),
/// and the certificate clients must trust.
struct Terminator {
    child: Child,
    files: [PathBuf; 2],
    addr: SocketAddr,
    certificate: rustls::pki_types::CertificateDer<'static>,
}

impl Drop for Terminator {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Terminator {
    async fn start(guard: &Guard) -> anyhow::Result<Self> {
        let generated = rcgen::generate_simple_self_signed(vec![PUBLIC_HOST.to_owned()])?;
        let port = free_port()?;
        let stem =
            std::env::temp_dir().join(format!("mcp-id-guard-public-{}-{port}", std::process::id()));
        let pem = stem.with_extension("pem");
        let config_path = stem.with_extension("cfg");
        std::fs::write(
            &pem,
            generated.cert.pem() + &generated.signing_key.serialize_pem(),
        )?;
        // The recipe's line, with the source address that tells the
        // terminator apart from the client on loopback.
        let server_line = r#"server guard "${GUARD_ADDR}""#;
        assert!(
            TEMPLATE.contains(server_line),
            "no `{server_line}` in the recipe"
        );
        let config = TEMPLATE
            .replace(
                server_line,
                &format!("{server_line} source {TERMINATOR_IP}"),
            )
            .replace("${PUBLIC_BIND}", &format!("127.0.0.1:{port}"))
            .replace("${CERT_PEM}", &pem.display().to_string())
            .replace("${GUARD_ADDR}", &guard.addr);
        assert!(!config.contains("${"), "unfilled placeholder:\n{config}");
        std::fs::write(&config_path, config)?;
        let child = Command::new("haproxy")
            .arg("-f")
            .arg(&config_path)
            .arg("-db")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("run haproxy")?;
        let mut terminator = Self {
            child,
            files: [pem, config_path],
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            certificate: generated.cert.der().clone(),
        };
        // HAProxy says nothing when it is ready; it is once it accepts.
        let deadline = tokio::time::Instant::now() + OK_TIMEOUT;
        loop {
            if tokio::net::TcpStream::connect(terminator.addr)
                .await
                .is_ok()
            {
                return Ok(terminator);
            }
            if let Some(status) = terminator.child.try_wait()? {
                let mut log = String::new();
                if let Some(mut stderr) = terminator.child.stderr.take() {
                    use tokio::io::AsyncReadExt as _;
                    let _ = stderr.read_to_string(&mut log).await;
                }
                bail!("haproxy exited ({status}): {log}");
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("haproxy did not listen on {}", terminator.addr);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A POST over HTTPS from the client's address, with SNI
    /// `mcp.example.test`, `Host: host` and `headers`: its status and
    /// body.
    async fn post(&self, host: &str, headers: &[(&str, &str)]) -> anyhow::Result<(u16, Value)> {
        tokio::time::timeout(OK_TIMEOUT, self.post_unbounded(host, headers))
            .await
            .context("no answer in time")?
    }

    async fn post_unbounded(
        &self,
        host: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Value)> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.certificate.clone())?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(format!("{CLIENT_IP}:0").parse()?)?;
        let tcp = socket.connect(self.addr).await?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(PUBLIC_HOST.try_into()?, tcp)
            .await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut request = http::Request::post("/mcp")
            .header("host", host)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let response = sender
            .send_request(request.body(Full::new(bytes::Bytes::from_static(body.as_bytes())))?)
            .await?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        let value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{status}: {}", String::from_utf8_lossy(&bytes)))?;
        Ok((status, value))
    }
}

/// What a client forges: earlier hops that never were.
const FORGED: &[(&str, &str)] = &[
    ("x-forwarded-for", "203.0.113.9"),
    ("x-forwarded-host", "evil.example"),
    ("forwarded", "for=203.0.113.9;proto=https"),
];

#[tokio::test]
async fn public_https_reaches_the_server_with_the_clients_address() -> anyhow::Result<()> {
    if skip_without_haproxy_for("public::public_https_reaches_the_server_with_the_clients_address")?
    {
        return Ok(());
    }
    let guard = guard(&["--trust-forwarded"]).await?;
    let terminator = Terminator::start(&guard).await?;

    let (status, seen) = terminator.post(PUBLIC_HOST, FORGED).await?;
    assert_eq!(status, 200, "{seen}");
    assert_eq!(
        seen,
        serde_json::json!({
            "x-forwarded-for": format!("{CLIENT_IP}, {TERMINATOR_IP}"),
            "x-forwarded-proto": "https",
            "x-forwarded-host": PUBLIC_HOST,
            "forwarded": null,
        })
    );
    // A port in Host is the same name (`--allowed-hosts NAME` allows any).
    let (status, _) = terminator.post(&format!("{PUBLIC_HOST}:443"), &[]).await?;
    assert_eq!(status, 200);

    // Another name, through the same TLS connection setup: the guard
    // refuses it (DNS rebinding), the server never sees it.
    let (status, refusal) = terminator.post("evil.example", &[]).await?;
    assert_eq!(status, 421, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert_eq!(refusal["id"], Value::Null, "{refusal}");
    Ok(())
}

/// The control: without `--trust-forwarded` the guard is the first hop the
/// server believes, so behind a terminator the server sees the terminator
/// as its client, over plain `http`.
#[tokio::test]
async fn control_without_trust_forwarded_the_server_sees_the_terminator() -> anyhow::Result<()> {
    if skip_without_haproxy_for(
        "public::control_without_trust_forwarded_the_server_sees_the_terminator",
    )? {
        return Ok(());
    }
    let guard = guard(&[]).await?;
    let terminator = Terminator::start(&guard).await?;
    let (status, seen) = terminator.post(PUBLIC_HOST, &[]).await?;
    assert_eq!(status, 200, "{seen}");
    assert_eq!(
        seen,
        serde_json::json!({
            "x-forwarded-for": TERMINATOR_IP,
            "x-forwarded-proto": "http",
            "x-forwarded-host": PUBLIC_HOST,
            "forwarded": null,
        })
    );
    Ok(())
}
