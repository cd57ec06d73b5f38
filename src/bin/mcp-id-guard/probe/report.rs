//! What the probe found: one verdict per check, the exit code, and the two
//! ways of showing them (text for people, `--json` for machines).

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

/// The verdict of one check, from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Verdict {
    /// Every request got its own answer.
    Ok,
    /// Duplicates were refused with an error; the others got their own
    /// answers. Safe.
    OkRefused,
    /// Not run (see the summary).
    Skipped,
    /// Not the bug this probe looks for, but worth a look (an accepted
    /// foreign Host or Origin).
    Warn,
    /// The check could not run to the end.
    Error,
    /// Answers were lost, hung, swapped or carried the wrong id.
    Bug,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::OkRefused => "OK-refused",
            Verdict::Skipped => "SKIPPED",
            Verdict::Warn => "WARN",
            Verdict::Error => "ERROR",
            Verdict::Bug => "BUG",
        }
    }
}

/// What the requests of a check got, one count per kind.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Counts {
    /// Requests answered with their own answer.
    pub(super) own: u32,
    /// Requests refused with an HTTP error status or a JSON-RPC error.
    pub(super) refused: u32,
    /// Requests answered with the answer of another request.
    pub(super) swapped: u32,
    /// Requests answered with another id (such as `"1"` for `1`).
    pub(super) wrong_id: u32,
    /// Requests with no answer within the timeout.
    pub(super) hung: u32,
    /// Requests whose connection or stream ended without an answer.
    pub(super) lost: u32,
}

/// How often one kind of refusal was seen.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RefusalCount {
    /// HTTP status.
    pub(super) status: u16,
    /// JSON-RPC error code, when the body carried one.
    pub(super) code: Option<i64>,
    /// How many requests got it.
    pub(super) count: u32,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Check {
    /// `same-id`, `number-vs-string`, `reuse-after-abandon`, `host`, `origin`.
    pub(super) name: &'static str,
    pub(super) verdict: Verdict,
    /// One line for people.
    pub(super) summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) counts: Option<Counts>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) refusals: Vec<RefusalCount>,
    /// A few of the failures, described.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) examples: Vec<String>,
}

impl Check {
    /// A check with nothing but a verdict and a summary.
    pub(super) fn plain(name: &'static str, verdict: Verdict, summary: impl Into<String>) -> Self {
        Self {
            name,
            verdict,
            summary: summary.into(),
            counts: None,
            refusals: Vec::new(),
            examples: Vec::new(),
        }
    }
}

/// Everything the probe found.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) url: String,
    /// The server's `serverInfo`, as it gave it.
    pub(super) server: Option<Value>,
    /// The protocol revision the server chose.
    pub(super) protocol_version: Option<String>,
    /// Whether the server gave the probe a session (`Mcp-Session-Id`).
    pub(super) session: bool,
    /// Names of the `--header`s sent (never their values).
    pub(super) headers: Vec<String>,
    pub(super) checks: Vec<Check>,
    /// Why the probe could not run, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
    /// The worst verdict that decides the exit code.
    pub(super) verdict: Verdict,
    pub(super) exit_code: u8,
}

impl Report {
    /// Sets the overall verdict and the exit code: 1 for a bug (or, with
    /// `strict`, a warning), 2 when the probe could not run, else 0.
    pub(super) fn decide(&mut self, strict: bool) {
        let worst = self.checks.iter().map(|check| check.verdict).max();
        let failed = self.error.is_some() || worst == Some(Verdict::Error);
        let (verdict, code) = match worst {
            Some(Verdict::Bug) => (Verdict::Bug, 1),
            _ if failed => (Verdict::Error, 2),
            Some(Verdict::Warn) => (Verdict::Warn, u8::from(strict)),
            Some(Verdict::OkRefused) => (Verdict::OkRefused, 0),
            _ => (Verdict::Ok, 0),
        };
        self.verdict = verdict;
        self.exit_code = code;
    }

    pub(super) fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "mcp-id-guard probe {}", self.url);
        if let Some(server) = &self.server {
            let name = server["name"].as_str().unwrap_or("?");
            let version = server["version"].as_str().unwrap_or("?");
            let _ = writeln!(
                out,
                "server: {name} {version}, protocol {}, {}",
                self.protocol_version.as_deref().unwrap_or("?"),
                if self.session {
                    "stateful (Mcp-Session-Id)"
                } else {
                    "no session"
                }
            );
        }
        if !self.headers.is_empty() {
            let _ = writeln!(out, "headers sent: {}", self.headers.join(", "));
        }
        if let Some(error) = &self.error {
            let _ = writeln!(out, "could not probe: {error}");
        }
        for check in &self.checks {
            let _ = writeln!(
                out,
                "{:<20} {:<10} {}",
                check.name,
                check.verdict.label(),
                check.summary
            );
            for example in &check.examples {
                let _ = writeln!(out, "{:<31} - {example}", "");
            }
        }
        let meaning = match self.verdict {
            Verdict::Bug => "the server cross-wires requests that share an id",
            Verdict::Error => "the probe could not finish",
            Verdict::Warn if self.exit_code == 0 => "no cross-wiring found; see the warnings",
            Verdict::Warn => "no cross-wiring found; warnings fail under --strict",
            _ => "no cross-wiring found",
        };
        let _ = writeln!(
            out,
            "verdict: {} (exit {}): {meaning}",
            self.verdict.label(),
            self.exit_code
        );
        out
    }
}
