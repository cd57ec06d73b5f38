//! What the probe found: one verdict per check, the exit code, and the two
//! ways of showing them (text for people, `--json` for machines).
//!
//! Whatever a server sends reaches the terminal escaped: control characters
//! (C0, DEL, C1: escape sequences, BEL, the 8-bit CSI) and the invisible
//! characters that reorder or hide text (bidirectional overrides and
//! isolates, line and paragraph separators, the byte-order mark) are shown
//! as `\u{..}` in the text report, and as `\uXXXX` in the JSON one (where
//! serde_json already escapes C0), so a server cannot clear the screen, set
//! the title or draw a verdict of its own.

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
    /// Requests sharing an id got an HTTP server error (5xx): the server
    /// fails them, though it did not cross-wire them.
    ServerError,
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
            Verdict::ServerError => "SERVER-ERROR",
            Verdict::Bug => "BUG",
        }
    }
}

/// What the requests of a check got, one count per kind.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Counts {
    /// Requests answered with their own answer.
    pub(super) own: u32,
    /// Requests refused with an HTTP client-error status or a JSON-RPC
    /// error.
    pub(super) refused: u32,
    /// Requests that got an HTTP server error (5xx).
    pub(super) server_error: u32,
    /// Requests answered with the answer of another request.
    pub(super) swapped: u32,
    /// Requests answered with another id (such as `"1"` for `1`).
    pub(super) wrong_id: u32,
    /// Requests with no answer within the timeout.
    pub(super) hung: u32,
    /// Requests whose connection or stream ended without an answer.
    pub(super) lost: u32,
    /// Requests not judged: the probe's run limit came first.
    pub(super) unfinished: u32,
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
    /// The HTTP server errors, by status and code.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) server_errors: Vec<RefusalCount>,
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
            server_errors: Vec::new(),
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

/// The longest text from the server the report shows in one place, in
/// characters.
const MAX_SHOWN_CHARS: usize = 400;

/// Whether `c` must not reach a terminal as it is.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// `text` for a terminal: [hidden] characters written as `\u{..}`, and cut
/// at [`MAX_SHOWN_CHARS`].
fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_SHOWN_CHARS));
    for (index, c) in text.chars().enumerate() {
        if index == MAX_SHOWN_CHARS {
            out.push_str("...");
            break;
        }
        if hidden(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Serialized JSON with the [hidden] characters serde_json writes as they
/// are (all but C0) escaped too; they can only stand in strings, so the
/// JSON means the same.
fn json_for_terminal(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        // C0 in the text is serde_json's layout (its newlines): in strings,
        // serde_json has escaped it.
        if hidden(c) && c >= ' ' {
            // Every hidden character is in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

impl Report {
    /// Sets the overall verdict and the exit code: 1 for a bug or server
    /// errors on shared ids (or, with `strict`, a warning), 2 when the
    /// probe could not run, else 0.
    pub(super) fn decide(&mut self, strict: bool) {
        let worst = self.checks.iter().map(|check| check.verdict).max();
        let failed = self.error.is_some() || worst == Some(Verdict::Error);
        let (verdict, code) = match worst {
            Some(Verdict::Bug) => (Verdict::Bug, 1),
            Some(Verdict::ServerError) => (Verdict::ServerError, 1),
            _ if failed => (Verdict::Error, 2),
            Some(Verdict::Warn) => (Verdict::Warn, u8::from(strict)),
            Some(Verdict::OkRefused) => (Verdict::OkRefused, 0),
            _ => (Verdict::Ok, 0),
        };
        self.verdict = verdict;
        self.exit_code = code;
    }

    /// What a `BUG` verdict says, by what the failing checks saw: only
    /// answers delivered to the wrong request (or with another id) show a
    /// cross-wire; answers that never came show that the server loses them,
    /// and a server that answered none at all showed nothing more.
    fn bug_meaning(&self) -> &'static str {
        let (mut crossed, mut missing, mut own) = (0, 0, 0);
        for check in &self.checks {
            if let (Verdict::Bug, Some(counts)) = (check.verdict, &check.counts) {
                crossed += counts.swapped + counts.wrong_id;
                missing += counts.hung + counts.lost;
                own += counts.own;
            }
        }
        match (crossed, missing, own) {
            (1.., _, _) => "the server cross-wires requests that share an id",
            (0, 1.., 0) => {
                "requests that share an id got no usable answer (hung or lost); \
                 the server may be down or too slow: no cross-wire was seen"
            }
            _ => "the server loses answers to requests that share an id (hung or lost)",
        }
    }

    pub(super) fn json(&self) -> String {
        json_for_terminal(&serde_json::to_string_pretty(self).unwrap_or_default())
    }

    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "mcp-id-guard probe {}", shown(&self.url));
        if let Some(server) = &self.server {
            let name = shown(server["name"].as_str().unwrap_or("?"));
            let version = shown(server["version"].as_str().unwrap_or("?"));
            let _ = writeln!(
                out,
                "server: {name} {version}, protocol {}, {}",
                shown(self.protocol_version.as_deref().unwrap_or("?")),
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
            let _ = writeln!(out, "could not probe: {}", shown(error));
        }
        for check in &self.checks {
            let _ = writeln!(
                out,
                "{:<20} {:<10} {}",
                check.name,
                check.verdict.label(),
                shown(&check.summary)
            );
            for example in &check.examples {
                let _ = writeln!(out, "{:<31} - {}", "", shown(example));
            }
        }
        let meaning = match self.verdict {
            Verdict::Bug => self.bug_meaning(),
            Verdict::ServerError => "the server fails requests that share an id (HTTP 5xx)",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bug(swapped: u32, hung: u32, own: u32) -> Check {
        let mut check = Check::plain("same-id", Verdict::Bug, "");
        check.counts = Some(Counts {
            own,
            swapped,
            hung,
            ..Counts::default()
        });
        check
    }

    /// The verdict's words say what was seen: a cross-wire only when an
    /// answer reached the wrong request.
    #[test]
    fn a_bug_says_what_was_seen() {
        let mut report = Report {
            url: "http://127.0.0.1:1/mcp".to_owned(),
            server: None,
            protocol_version: None,
            session: true,
            headers: Vec::new(),
            checks: Vec::new(),
            error: None,
            verdict: Verdict::Ok,
            exit_code: 0,
        };
        for (check, words) in [
            (bug(1, 3, 6), "cross-wires"),
            (bug(0, 10, 0), "no usable answer"),
            (bug(0, 2, 8), "loses answers"),
        ] {
            report.checks = vec![check];
            report.decide(false);
            assert_eq!(report.exit_code, 1);
            let text = report.text();
            let verdict = text.lines().last().unwrap();
            assert!(verdict.contains(words), "{verdict}");
        }
    }

    #[test]
    fn nothing_hidden_reaches_the_terminal() {
        let hostile = "\u{1b}[2J\u{1b}]0;t\u{7}\u{9b}31m\u{202e}x\u{7f}\u{2028}ok";
        let text = shown(hostile);
        assert!(!text.chars().any(hidden), "{text}");
        assert_eq!(
            text,
            "\\u{1b}[2J\\u{1b}]0;t\\u{7}\\u{9b}31m\\u{202e}x\\u{7f}\\u{2028}ok"
        );
        assert_eq!(shown(&"x".repeat(1000)).len(), MAX_SHOWN_CHARS + 3);
        let json = serde_json::to_string(&serde_json::json!({ "name": hostile })).unwrap();
        let safe = json_for_terminal(&json);
        assert!(!safe.chars().any(hidden), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["name"], hostile);
    }
}
