//! The upstream as a child process: `mcp-id-guard --upstream-port 3000 --
//! node server.js` runs the user's server and the proxy in front of it as
//! one command, for servers in other languages (TypeScript above all) whose
//! users would otherwise start and stop two programs in the right order.
//!
//! What is done here: start the command with the proxy's environment plus
//! `PORT=<N>`; serve only once 127.0.0.1:N accepts a TCP connection (polled
//! with a short backoff, bounded by `--upstream-start-timeout`; a command that
//! exits first, or takes longer, is reported in one line and the proxy
//! exits); pass SIGINT/SIGTERM on to it; wait for it with a bound, then kill
//! it; report its exit code as the proxy's own (128+N for signal N, as shells
//! do). A command that exits by itself stops the proxy (see `main`).
//!
//! Why no supervisor crate: this is one child whose life is the proxy's, not
//! a process tree to restart. `tokio::process` (the ecosystem's async process
//! API, from tokio, already in the tree) starts it, reaps it, and kills it
//! when dropped (`kill_on_drop`, so an early return never leaves it running);
//! rustix (already a dependency, for the descriptor limit) sends it signals
//! without unsafe code. Restarts are the job of whatever runs the proxy
//! (systemd, Kubernetes, Docker), which sees the child's exit code. The
//! child stays in the proxy's process group: a group-wide signal (a
//! terminal's Ctrl-C, `timeout`, a CI runner's cleanup) reaches both.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::signals::{Signals, Stop};

/// How long the child may take to exit after the signal was passed on (and
/// the proxy's own grace period is over); then it is killed (SIGKILL).
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The first pause between two connection attempts while the child starts;
/// it doubles up to [`MAX_POLL_PAUSE`].
const FIRST_POLL_PAUSE: Duration = Duration::from_millis(10);
const MAX_POLL_PAUSE: Duration = Duration::from_millis(200);

/// The running upstream command (killed if dropped).
pub(crate) struct Upstream {
    child: Child,
    /// The command as log lines name it (see [`show`]).
    command: String,
}

/// Why [`Upstream::start`] returned no running upstream.
pub(crate) enum NotStarted {
    /// It could not start, exited, or did not listen in time: one line to
    /// log, and the proxy exits with a failure.
    Failed(String),
    /// SIGINT/SIGTERM arrived while it started: passed on, and the child
    /// has exited with this status.
    Stopped(Stop, ExitStatus),
}

impl Upstream {
    /// Starts `command` (program and arguments) with `PORT=<port>` and waits
    /// until 127.0.0.1:`port` accepts a connection, at most `timeout`.
    pub(crate) async fn start(
        command: &[String],
        port: u16,
        timeout: Duration,
        signals: &mut Signals,
    ) -> Result<Self, NotStarted> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let shown = show(command);
        let (program, arguments) = command
            .split_first()
            .ok_or_else(|| NotStarted::Failed("no upstream command after `--`".to_owned()))?;
        // A server already there would answer for the child, which would
        // then fail to listen.
        if TcpStream::connect(address).await.is_ok() {
            return Err(NotStarted::Failed(format!(
                "{address} already accepts connections before `{shown}` was started: \
                 pick a free --upstream-port, or stop what listens there"
            )));
        }
        let child = Command::new(program)
            .args(arguments)
            .env("PORT", port.to_string())
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                NotStarted::Failed(format!(
                    "cannot start the upstream command `{shown}`: {error}"
                ))
            })?;
        tracing::info!(
            "started the upstream command `{shown}` (pid {}) with PORT={port}; waiting until it accepts connections on {address}",
            child.id().unwrap_or_default()
        );
        let mut upstream = Upstream {
            child,
            command: shown,
        };
        let started = Instant::now();
        let deadline = started + timeout;
        let mut pause = FIRST_POLL_PAUSE;
        loop {
            let attempt = async {
                // Refused at once while nothing listens; bounded in case
                // something swallows the SYN.
                match tokio::time::timeout(MAX_POLL_PAUSE, TcpStream::connect(address)).await {
                    Ok(Ok(_)) => true,
                    _ => {
                        tokio::time::sleep(pause).await;
                        false
                    }
                }
            };
            tokio::select! {
                biased;
                status = upstream.child.wait() => {
                    return Err(NotStarted::Failed(match status {
                        Ok(status) => format!(
                            "the upstream command `{}` exited ({status}) before it accepted connections on {address}",
                            upstream.command
                        ),
                        Err(error) => format!("cannot wait for the upstream command `{}`: {error}", upstream.command),
                    }));
                }
                stop = signals.recv() => {
                    upstream.signal(stop);
                    return match upstream.stop(STOP_TIMEOUT).await {
                        Ok(status) => Err(NotStarted::Stopped(stop, status)),
                        Err(message) => Err(NotStarted::Failed(message)),
                    };
                }
                () = tokio::time::sleep_until(deadline) => {
                    let _ = upstream.child.kill().await;
                    return Err(NotStarted::Failed(format!(
                        "the upstream command `{}` did not accept connections on {address} within {timeout:?} \
                         (--upstream-start-timeout); killed it. Does it listen on PORT ({port}) at 127.0.0.1?",
                        upstream.command
                    )));
                }
                ready = attempt => if ready {
                    tracing::info!(
                        "the upstream command accepts connections on {address} ({:?} after it started)",
                        started.elapsed()
                    );
                    return Ok(upstream);
                },
            }
            pause = (pause * 2).min(MAX_POLL_PAUSE);
        }
    }

    /// The command as log lines name it (see [`show`]).
    pub(crate) fn command(&self) -> &str {
        &self.command
    }

    /// Resolves when the child exits.
    pub(crate) async fn exited(&mut self) -> Result<ExitStatus, String> {
        self.child.wait().await.map_err(|error| {
            format!(
                "cannot wait for the upstream command `{}`: {error}",
                self.command
            )
        })
    }

    /// Passes `stop` on to the child (on Unix the same signal; elsewhere it
    /// is killed).
    pub(crate) fn signal(&mut self, stop: Stop) {
        #[cfg(unix)]
        {
            let Some(pid) = self
                .child
                .id()
                .and_then(|pid| i32::try_from(pid).ok())
                .and_then(rustix::process::Pid::from_raw)
            else {
                return; // already reaped
            };
            if let Err(error) = rustix::process::kill_process(pid, stop.signal()) {
                tracing::warn!(%error, "cannot pass {} on to the upstream command", stop.name());
            }
        }
        #[cfg(not(unix))]
        {
            let _ = stop;
            let _ = self.child.start_kill();
        }
    }

    /// Waits for the child to exit, at most `within`; then kills it.
    pub(crate) async fn stop(&mut self, within: Duration) -> Result<ExitStatus, String> {
        if let Ok(status) = tokio::time::timeout(within, self.child.wait()).await {
            return status.map_err(|error| {
                format!(
                    "cannot wait for the upstream command `{}`: {error}",
                    self.command
                )
            });
        }
        tracing::warn!(
            "the upstream command `{}` did not exit within {within:?}; killing it",
            self.command
        );
        self.child.kill().await.map_err(|error| {
            format!(
                "cannot kill the upstream command `{}`: {error}",
                self.command
            )
        })?;
        self.exited().await
    }
}

/// The proxy's exit code for the child's exit status: its code, or 128+N
/// when signal N ended it (as shells report it).
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return u8::try_from(128 + (signal & 0x7f)).unwrap_or(1);
        }
    }
    1
}

/// The command as log lines name it: the program, and how many arguments it
/// has. Arguments may carry secrets (`--api-key ...`), and log lines go
/// wherever the operator's logs go.
fn show(command: &[String]) -> String {
    let Some((program, arguments)) = command.split_first() else {
        return String::new();
    };
    let program = if program.is_empty()
        || program.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'')
    {
        format!("{program:?}")
    } else {
        program.clone()
    };
    match arguments.len() {
        0 => program,
        1 => format!("{program} (1 argument)"),
        count => format!("{program} ({count} arguments)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        let command = ["node", "server.js", "--api-key", "secret"].map(String::from);
        assert_eq!(show(&command), "node (3 arguments)");
        assert_eq!(show(&["my server".to_owned()]), r#""my server""#);
        assert_eq!(show(&["a".to_owned(), "b".to_owned()]), "a (1 argument)");
    }

    #[cfg(unix)]
    #[test]
    fn exit_codes() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 128 + 15);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 128 + 9);
    }
}
