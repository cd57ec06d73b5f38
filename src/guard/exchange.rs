//! What the guard did with each JSON-RPC message of a POST, left on the
//! response for the layers outside it (the metrics layer counts requests by
//! method and decision from it).

use crate::table::InlineVec;
use crate::wire::method::McpMethod;

/// What the guard did with one message of a POST. Each value is counted in
/// the guard's [`Stats`](crate::Stats) too, except `refused` (there split by
/// cause) and `passed` for a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum GuardDecision {
    /// Forwarded as the client wrote it: a request with its own id, a
    /// notification (other than a cancellation that freed an id), or a POST
    /// the guard does not track (no session, revision 2026-07-28, a body that
    /// is no JSON-RPC).
    Passed,
    /// A request forwarded with a server-side id (a duplicate of an id in
    /// flight, an abandoned id reused, or `rewrite_all_ids`).
    Remapped,
    /// A duplicate the policy refused (`Reject`, or a batch under `Queue`):
    /// answered by the guard, never forwarded.
    Rejected,
    /// A request that waited for its id under `Queue`, whatever came of it
    /// (forwarded when its turn came, or `503` after `max_queue_wait`).
    Queued,
    /// Answered by the guard for any other reason: the session at its
    /// in-flight cap, the table at its byte budget, a session id too long, a
    /// body too large, unreadable or compressed, several session headers, or
    /// a request of a batch refused for its sibling's duplicate.
    Refused,
    /// A `notifications/cancelled` that named a request in flight in its
    /// session (and freed its id); forwarded.
    Cancelled,
}

impl GuardDecision {
    /// Every decision, in order.
    pub const ALL: &'static [GuardDecision] = &[
        Self::Passed,
        Self::Remapped,
        Self::Rejected,
        Self::Queued,
        Self::Refused,
        Self::Cancelled,
    ];

    /// The decision as a label value: `passed`, `remapped`, `rejected`,
    /// `queued`, `refused` or `cancelled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Remapped => "remapped",
            Self::Rejected => "rejected",
            Self::Queued => "queued",
            Self::Refused => "refused",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One message of a POST: its method and what the guard did with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    method: McpMethod,
    decision: GuardDecision,
}

impl Handled {
    /// The message's method (`Other` for any method not in the closed list).
    pub fn method(&self) -> McpMethod {
        self.method
    }

    /// What the guard did with it.
    pub fn decision(&self) -> GuardDecision {
        self.decision
    }
}

/// The guard's account of one POST, put in the extensions of its response
/// (the inner service's or the guard's own): the method of each request and
/// notification in it, in order (a batch has one per member; client
/// responses to server requests and elements that are no message have none),
/// and what the guard did with each.
///
/// A POST the guard does not read (no session, revision 2026-07-28) counts as
/// one message, `passed`, whose method is the `Mcp-Method` header's (which
/// revision 2026-07-28 sends) or `Other`. A POST refused before its body
/// could be read counts as one `Other`, `refused`. `GET` and `DELETE` carry
/// no `Exchange`.
///
/// ```
/// # use http::Response;
/// use mcp_id_guard::{Exchange, GuardDecision, McpMethod};
///
/// fn remapped_tool_calls<B>(response: &Response<B>) -> usize {
///     response.extensions().get::<Exchange>().map_or(0, |exchange| {
///         exchange
///             .iter()
///             .filter(|handled| {
///                 handled.method() == McpMethod::ToolsCall
///                     && handled.decision() == GuardDecision::Remapped
///             })
///             .count()
///     })
/// }
/// # assert_eq!(remapped_tool_calls(&Response::new(())), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    // Nearly every POST carries one message: kept inline, no allocation.
    handled: InlineVec<Handled>,
}

impl Exchange {
    /// One message.
    pub(crate) fn one(method: McpMethod, decision: GuardDecision) -> Self {
        Self {
            handled: InlineVec::One([Handled { method, decision }]),
        }
    }

    pub(crate) fn push(&mut self, method: McpMethod, decision: GuardDecision) {
        self.handled.push(Handled { method, decision });
    }

    /// The messages, in the POST's order.
    pub fn iter(&self) -> std::slice::Iter<'_, Handled> {
        self.handled.iter()
    }

    /// How many messages the POST held.
    pub fn len(&self) -> usize {
        self.handled.len()
    }

    /// Whether it held none (only client responses, say).
    pub fn is_empty(&self) -> bool {
        self.handled.is_empty()
    }
}

impl<'a> IntoIterator for &'a Exchange {
    type Item = &'a Handled;
    type IntoIter = std::slice::Iter<'a, Handled>;

    fn into_iter(self) -> Self::IntoIter {
        self.handled.iter()
    }
}
