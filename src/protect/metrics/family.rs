//! The label sets of [`Metrics`](super::Metrics)' families, as
//! prometheus-client encodes them, and the tool names that get a series.

use std::fmt;
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};

use crate::guard::{GuardDecision, McpMethod};

/// Encodes `pairs` as a label set.
fn pairs(encoder: &mut LabelSetEncoder<'_>, pairs: &[(&str, &str)]) -> fmt::Result {
    EncodeLabelSet::encode(&pairs, encoder)
}

/// `status="200"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Status(pub(super) u16);

impl EncodeLabelSet for Status {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> fmt::Result {
        [("status", self.0)].encode(encoder)
    }
}

/// `kind="host"`, `reason="request_cap"`: one label with a fixed name and a
/// value from a short list of our own (nothing to escape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Named(pub(super) &'static str, pub(super) &'static str);

impl EncodeLabelSet for Named {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> fmt::Result {
        pairs(encoder, &[(self.0, self.1)])
    }
}

/// `mcp_method_name="tools/call",decision="remapped"`: one JSON-RPC message
/// as the guard handled it, and `gen_ai_tool_name="..."` for a `tools/call`
/// when tool names are asked for. Method and decision come from closed
/// lists, a tool name from the first few the operator allows (MCP tool
/// names, which need no escaping): a bounded number of series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Operation {
    pub(super) method: McpMethod,
    pub(super) decision: GuardDecision,
    pub(super) tool: Option<ToolLabel>,
}

/// The `gen_ai_tool_name` of a `tools/call`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ToolLabel {
    /// One of the first distinct names seen.
    Named(Arc<str>),
    /// Past the cap, or no name MCP allows.
    Other,
}

impl EncodeLabelSet for Operation {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> fmt::Result {
        let method = ("mcp_method_name", self.method.as_str());
        let decision = ("decision", self.decision.as_str());
        match &self.tool {
            Some(ToolLabel::Named(name)) => {
                pairs(encoder, &[method, decision, ("gen_ai_tool_name", &**name)])
            }
            Some(ToolLabel::Other) => {
                pairs(encoder, &[method, decision, ("gen_ai_tool_name", "other")])
            }
            None => pairs(encoder, &[method, decision]),
        }
    }
}

/// The tool names that have a series of their own: the first `max`
/// distinct ones recorded.
#[derive(Debug, Default)]
pub(super) struct ToolNames {
    names: RwLock<Vec<Arc<str>>>,
}

impl ToolNames {
    /// `name`'s label, admitting it while fewer than `max` names are.
    pub(super) fn label(&self, name: Option<&str>, max: usize) -> ToolLabel {
        let Some(name) = name else {
            return ToolLabel::Other;
        };
        let find = |names: &[Arc<str>]| names.iter().find(|known| ***known == *name).cloned();
        {
            let names = self.names.read().unwrap_or_else(|e| e.into_inner());
            if let Some(known) = find(&names) {
                return ToolLabel::Named(known);
            }
            if names.len() >= max {
                return ToolLabel::Other;
            }
        }
        let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = find(&names) {
            return ToolLabel::Named(known);
        }
        if names.len() >= max {
            return ToolLabel::Other;
        }
        let name: Arc<str> = Arc::from(name);
        names.push(Arc::clone(&name));
        ToolLabel::Named(name)
    }
}
