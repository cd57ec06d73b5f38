//! SIGINT and SIGTERM, the signals that stop the proxy: listened for once,
//! from the start, so that one arriving while the upstream command starts
//! (see `child`) is not lost, and known by name, so that the same one can be
//! passed on to the child.

/// A request to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    #[cfg_attr(not(unix), allow(dead_code))]
    Terminate,
}

impl Stop {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stop::Interrupt if cfg!(unix) => "SIGINT",
            Stop::Interrupt => "Ctrl-C",
            Stop::Terminate => "SIGTERM",
        }
    }

    /// The signal itself, to pass it on.
    #[cfg(unix)]
    pub(crate) fn signal(self) -> rustix::process::Signal {
        match self {
            Stop::Interrupt => rustix::process::Signal::INT,
            Stop::Terminate => rustix::process::Signal::TERM,
        }
    }
}

/// The process's SIGINT and SIGTERM listeners (from its creation on; call
/// it inside the runtime).
pub(crate) struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let interrupt = signal(SignalKind::interrupt())
                .inspect_err(|error| {
                    tracing::warn!(%error, "cannot listen for SIGINT; Ctrl-C does not stop the proxy gracefully");
                })
                .ok();
            let terminate = signal(SignalKind::terminate())
                .inspect_err(|error| {
                    tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the proxy");
                })
                .ok();
            Signals {
                interrupt,
                terminate,
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// Resolves on the next SIGINT (Ctrl-C) or SIGTERM.
    pub(crate) async fn recv(&mut self) -> Stop {
        #[cfg(unix)]
        {
            async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        if signal.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = next(self.interrupt.as_mut()) => Stop::Interrupt,
                () = next(self.terminate.as_mut()) => Stop::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            Stop::Interrupt
        }
    }
}
