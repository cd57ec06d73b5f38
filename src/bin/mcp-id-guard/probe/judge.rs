//! Telling a request's own answer from another's: every method's answer has
//! a shape (`ping` answers `{}`, `tools/list` answers `{"tools": [...]}`, a
//! tool answers `{"content": [...]}`), learned from the server before the
//! checks, so an answer of the wrong shape is one that was swapped.

use std::collections::BTreeMap;

use serde_json::Value;

#[cfg(test)]
use super::scan::Answer;

use super::client::Reply;
use super::report::{Check, Counts, RefusalCount, Verdict};

/// How many failures a check describes one by one.
const EXAMPLES: usize = 5;

/// What an answer looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Shape {
    /// A result with `tools` (`tools/list`).
    Tools,
    /// A result with `content` (`tools/call`).
    Content,
    /// Any other result (`ping`'s `{}`).
    Other,
    /// A JSON-RPC error with this code.
    Error(i64),
}

impl Shape {
    /// The shape of a whole message (the scanner's tests compare with it).
    #[cfg(test)]
    pub(super) fn of(message: &Value) -> Self {
        if let Some(error) = message.get("error") {
            return Shape::Error(error["code"].as_i64().unwrap_or_default());
        }
        let result = &message["result"];
        if result.get("tools").is_some() {
            Shape::Tools
        } else if result.get("content").is_some() {
            Shape::Content
        } else {
            Shape::Other
        }
    }

    fn described(&self) -> String {
        match self {
            Shape::Tools => "a tools/list answer".to_owned(),
            Shape::Content => "a tool's answer".to_owned(),
            Shape::Other => "a ping answer".to_owned(),
            Shape::Error(code) => format!("an error {code}"),
        }
    }
}

/// What one request of a check got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Received {
    /// Its own answer.
    Own,
    /// An HTTP client-error status or a JSON-RPC error: refused, which is
    /// safe.
    Refused { status: u16, code: Option<i64> },
    /// An HTTP server-error status (5xx): the server failed the request,
    /// which is neither its answer nor a refusal.
    ServerError { status: u16, code: Option<i64> },
    /// The probe's run limit came first: not judged.
    Unfinished,
    /// Another request's answer (described).
    Swapped(String),
    /// An answer with another id (shown).
    WrongId(String),
    /// No answer within the timeout.
    Hung,
    /// The connection or stream ended without an answer (why).
    Lost(String),
}

impl Received {
    fn is_bug(&self) -> bool {
        matches!(
            self,
            Received::Swapped(_) | Received::WrongId(_) | Received::Hung | Received::Lost(_)
        )
    }

    fn described(&self) -> String {
        match self {
            Received::Own => "its own answer".to_owned(),
            Received::Refused { status, code } => match code {
                Some(code) => format!("refused ({status}, code {code})"),
                None => format!("refused ({status})"),
            },
            Received::ServerError { status, code } => match code {
                Some(code) => format!("server error ({status}, code {code})"),
                None => format!("server error ({status})"),
            },
            Received::Unfinished => "not judged: the probe ran out of time".to_owned(),
            Received::Swapped(what) => format!("got {what}"),
            Received::WrongId(id) => format!("got an answer with id {id}"),
            Received::Hung => "no answer within the timeout".to_owned(),
            Received::Lost(why) => format!("lost: {why}"),
        }
    }
}

/// Judges `reply` to a request that carried `id` and whose own answer has
/// the shape `own`.
pub(super) fn judge(reply: &Reply, id: &Value, own: &Shape) -> Received {
    let (status, answer) = match reply {
        Reply::Hung => return Received::Hung,
        Reply::OutOfTime => return Received::Unfinished,
        Reply::Lost(why) => return Received::Lost(why.clone()),
        Reply::Status { status, .. } if *status >= 500 => {
            return Received::ServerError {
                status: *status,
                code: None,
            }
        }
        Reply::Status { status, .. } if *status >= 400 => {
            return Received::Refused {
                status: *status,
                code: None,
            }
        }
        Reply::Status { status, body } => {
            return Received::Lost(format!("HTTP {status} without an answer: {body:?}"))
        }
        Reply::Answer { status, answer } => (*status, answer),
    };
    let code = match answer.shape {
        Shape::Error(code) => Some(code),
        _ => None,
    };
    if status >= 500 {
        // Whatever the body says, the server failed the request.
        return Received::ServerError { status, code };
    }
    let refused = || Received::Refused { status, code };
    // An error about the request as a whole may carry a null id.
    if answer.id != *id {
        return match answer.shape {
            Shape::Error(_) if answer.id.is_null() => refused(),
            _ => Received::WrongId(answer.id.to_string()),
        };
    }
    match &answer.shape {
        shape if shape == own => Received::Own,
        Shape::Error(_) => refused(),
        shape => Received::Swapped(shape.described()),
    }
}

/// The requests of one check, counted.
#[derive(Debug, Default)]
pub(super) struct Scorecard {
    counts: Counts,
    refusals: BTreeMap<(u16, Option<i64>), u32>,
    server_errors: BTreeMap<(u16, Option<i64>), u32>,
    examples: Vec<String>,
    /// Pairs (or trials) in which something went wrong.
    failed: u32,
}

impl Scorecard {
    /// Counts one request; `what` names it for the examples.
    pub(super) fn add(&mut self, seen: &Received, what: impl FnOnce() -> String) {
        let counts = &mut self.counts;
        match seen {
            Received::Own => counts.own += 1,
            Received::Refused { status, code } => {
                counts.refused += 1;
                *self.refusals.entry((*status, *code)).or_default() += 1;
            }
            Received::ServerError { status, code } => {
                counts.server_error += 1;
                *self.server_errors.entry((*status, *code)).or_default() += 1;
            }
            Received::Unfinished => counts.unfinished += 1,
            Received::Swapped(_) => counts.swapped += 1,
            Received::WrongId(_) => counts.wrong_id += 1,
            Received::Hung => counts.hung += 1,
            Received::Lost(_) => counts.lost += 1,
        }
        let worth_an_example = seen.is_bug() || matches!(seen, Received::ServerError { .. });
        if worth_an_example && self.examples.len() < EXAMPLES {
            self.examples
                .push(format!("{}: {}", what(), seen.described()));
        }
    }

    /// Counts one pair or trial: failed when any of its requests failed.
    pub(super) fn trial(&mut self, seen: &[Received]) {
        if seen.iter().any(Received::is_bug) {
            self.failed += 1;
        }
    }

    /// The check's result; `trials` says what was run ("20 pairs, 10 at a
    /// time").
    pub(super) fn check(self, name: &'static str, trials: &str) -> Check {
        let counts = self.counts;
        let verdict = if self.failed > 0 {
            Verdict::Bug
        } else if counts.server_error > 0 {
            Verdict::ServerError
        } else if counts.unfinished > 0 {
            Verdict::Error
        } else if counts.refused > 0 {
            Verdict::OkRefused
        } else {
            Verdict::Ok
        };
        let listed = |map: BTreeMap<(u16, Option<i64>), u32>| -> Vec<RefusalCount> {
            map.into_iter()
                .map(|((status, code), count)| RefusalCount {
                    status,
                    code,
                    count,
                })
                .collect()
        };
        let refusals = listed(self.refusals);
        let server_errors = listed(self.server_errors);
        let kinds = |counted: &[RefusalCount]| -> String {
            counted
                .iter()
                .map(|refusal| match refusal.code {
                    Some(code) => {
                        format!("{} x HTTP {} code {code}", refusal.count, refusal.status)
                    }
                    None => format!("{} x HTTP {}", refusal.count, refusal.status),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = vec![format!("{} own", counts.own)];
        if counts.refused > 0 {
            parts.push(format!("{} refused ({})", counts.refused, kinds(&refusals)));
        }
        if counts.server_error > 0 {
            parts.push(format!(
                "{} server errors ({})",
                counts.server_error,
                kinds(&server_errors)
            ));
        }
        for (count, what) in [
            (counts.swapped, "swapped"),
            (counts.wrong_id, "wrong id"),
            (counts.hung, "hung"),
            (counts.lost, "lost"),
            (counts.unfinished, "not judged (the probe ran out of time)"),
        ] {
            if count > 0 {
                parts.push(format!("{count} {what}"));
            }
        }
        let failed = if self.failed > 0 {
            format!("{} failed; ", self.failed)
        } else {
            String::new()
        };
        Check {
            name,
            verdict,
            summary: format!("{trials}: {failed}answers: {}", parts.join(", ")),
            counts: Some(counts),
            refusals,
            server_errors,
            examples: self.examples,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn answer(status: u16, message: Value) -> Reply {
        Reply::Answer {
            status,
            answer: Answer {
                id: message["id"].clone(),
                shape: Shape::of(&message),
                error_message: None,
                protocol_version: None,
                server: None,
            },
        }
    }

    #[test]
    fn answers_are_told_apart_by_shape_and_id() {
        let ping = Shape::Other;
        let id = json!(7);
        let own = answer(200, json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
        assert_eq!(judge(&own, &id, &ping), Received::Own);
        let tools = answer(
            200,
            json!({"jsonrpc": "2.0", "id": 7, "result": {"tools": []}}),
        );
        assert!(matches!(judge(&tools, &id, &ping), Received::Swapped(_)));
        let string = answer(200, json!({"jsonrpc": "2.0", "id": "7", "result": {}}));
        assert!(matches!(judge(&string, &id, &ping), Received::WrongId(_)));
        let rejected = answer(
            400,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": "x"}}),
        );
        assert_eq!(
            judge(&rejected, &id, &ping),
            Received::Refused {
                status: 400,
                code: Some(-32600)
            }
        );
        let null = answer(
            409,
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "x"}}),
        );
        assert!(matches!(judge(&null, &id, &ping), Received::Refused { .. }));
        assert_eq!(judge(&Reply::Hung, &id, &ping), Received::Hung);
        let accepted = Reply::Status {
            status: 202,
            body: String::new(),
        };
        assert!(matches!(judge(&accepted, &id, &ping), Received::Lost(_)));
        let crashed = Reply::Status {
            status: 500,
            body: "Internal Server Error".to_owned(),
        };
        assert_eq!(
            judge(&crashed, &id, &ping),
            Received::ServerError {
                status: 500,
                code: None
            }
        );
        let busy = answer(
            503,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32000, "message": "x"}}),
        );
        assert_eq!(
            judge(&busy, &id, &ping),
            Received::ServerError {
                status: 503,
                code: Some(-32000)
            }
        );
        assert_eq!(judge(&Reply::OutOfTime, &id, &ping), Received::Unfinished);
    }

    #[test]
    fn server_errors_are_their_own_verdict() {
        let mut scorecard = Scorecard::default();
        for seen in [
            Received::Own,
            Received::ServerError {
                status: 500,
                code: None,
            },
        ] {
            scorecard.add(&seen, || "x".to_owned());
        }
        let check = scorecard.check("same-id", "1 pair");
        assert_eq!(check.verdict, Verdict::ServerError);
        assert!(
            check.summary.contains("1 server errors (1 x HTTP 500)"),
            "{}",
            check.summary
        );
    }
}
