//! The `mcp-id-guard` binary as a process: started on an ephemeral loopback
//! port, its log lines collected, killed when dropped.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::OK_TIMEOUT;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mcp-id-guard");

/// A running `mcp-id-guard` process (killed on drop) and its log lines.
pub struct Guard {
    child: Child,
    /// `http://127.0.0.1:<port>`, read from the startup line.
    pub base: String,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// Log lines not yet taken by [`wait_for_line`](Self::wait_for_line).
    lines: mpsc::UnboundedReceiver<String>,
    /// Every log line so far.
    log: Arc<Mutex<Vec<String>>>,
}

impl Guard {
    /// Starts the binary on an ephemeral loopback port with `args` and waits
    /// for its startup line.
    pub async fn start(args: &[&str]) -> anyhow::Result<Self> {
        Self::spawn(None, args, &[]).await
    }

    /// As [`start`](Self::start), with environment variables set.
    pub async fn start_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::spawn(None, args, env).await
    }

    /// As [`start`](Self::start), under `sh -c "ulimit -n <nofile>; exec ..."`
    /// when `nofile` is given.
    pub async fn start_in(nofile: Option<u32>, args: &[&str]) -> anyhow::Result<Self> {
        Self::spawn(nofile, args, &[]).await
    }

    async fn spawn(
        nofile: Option<u32>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut command = match nofile {
            Some(nofile) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
                    .arg(BIN);
                command
            }
            None => Command::new(BIN),
        };
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("MCP_ID_GUARD_UPSTREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().context("spawn mcp-id-guard")?;
        let stderr = child.stderr.take().context("stderr")?;
        let (tx, mut lines) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&log);
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                keep.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let startup = tokio::time::timeout(OK_TIMEOUT, async {
            while let Some(line) = lines.recv().await {
                if line.contains("listening on") {
                    return Some(line);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .with_context(|| format!("no startup line; log: {:?}", log.lock().unwrap()))?;
        println!("startup line: {startup}");
        let base = startup
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .context("no address on the startup line")?
            .to_owned();
        let addr = base.trim_start_matches("http://").to_owned();
        Ok(Self {
            child,
            base,
            addr,
            lines,
            log,
        })
    }

    /// `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// Waits (bounded) for the next log line containing `text`.
    pub async fn wait_for_line(&mut self, text: &str) -> anyhow::Result<String> {
        let found = tokio::time::timeout(OK_TIMEOUT, async {
            while let Some(line) = self.lines.recv().await {
                if line.contains(text) {
                    return Some(line);
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        found.with_context(|| format!("no {text:?} in {:?}", self.log.lock().unwrap()))
    }

    /// Waits (bounded) until a log line contains `text`; returns every such
    /// line so far. Lines reach the test through a pipe and a reader task,
    /// so a line written before a response may arrive after it.
    pub async fn wait_for_lines(&self, text: &str) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + OK_TIMEOUT;
        loop {
            let lines = self.lines_with(text);
            if !lines.is_empty() {
                return Ok(lines);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no {text:?} in {:?}",
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Log lines containing `text` so far.
    pub fn lines_with(&self, text: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(text))
            .cloned()
            .collect()
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGTERM (a graceful stop).
    pub fn sigterm(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("already exited")?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM {pid}: {status}");
        Ok(())
    }

    /// Waits (bounded) for the process to exit.
    pub async fn wait_exit(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => bail!(
                "still running after {within:?}; log: {:?}",
                self.log.lock().unwrap()
            ),
        }
    }
}
