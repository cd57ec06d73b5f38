//! The MCP methods a client sends, by name: a closed list, so that a label
//! made from a method (a metric's `mcp_method_name`) has a bounded set of
//! values whatever a client writes. Every other method is [`McpMethod::Other`].

use std::borrow::Cow;

use crate::wire::scan::plain_string;

/// Declares [`McpMethod`] and its names once, in one list.
macro_rules! methods {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// The method of a JSON-RPC message a client sends, one of the MCP
        /// methods (revision 2025-11-25, tasks included) or
        /// [`Other`](Self::Other): a closed list, so a metric label made from
        /// it has a bounded set of values. Read by the guard from each
        /// message's `method` as servers decode it (`"tools\/list"` is
        /// `tools/list`); see [`Exchange`](crate::exchange::Exchange).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum McpMethod {
            $($(#[$doc])* $variant,)*
            /// Any method not in the list, and a message whose method is
            /// not known (a body the guard did not read).
            #[default]
            Other,
        }

        impl McpMethod {
            /// Every method of the list, [`Other`](Self::Other) last.
            pub const ALL: &'static [McpMethod] = &[$(Self::$variant,)* Self::Other];

            /// The method's name as MCP spells it; `"other"` for
            /// [`Other`](Self::Other).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                    Self::Other => "other",
                }
            }

            /// The method a decoded name is; [`Other`](Self::Other) for any
            /// name not in the list.
            pub fn from_name(name: &[u8]) -> Self {
                match name {
                    $(_ if name == $name.as_bytes() => Self::$variant,)*
                    _ => Self::Other,
                }
            }
        }
    };
}

methods! {
    /// `initialize`
    Initialize = "initialize",
    /// `ping`
    Ping = "ping",
    /// `tools/list`
    ToolsList = "tools/list",
    /// `tools/call`
    ToolsCall = "tools/call",
    /// `resources/list`
    ResourcesList = "resources/list",
    /// `resources/templates/list`
    ResourcesTemplatesList = "resources/templates/list",
    /// `resources/read`
    ResourcesRead = "resources/read",
    /// `resources/subscribe`
    ResourcesSubscribe = "resources/subscribe",
    /// `resources/unsubscribe`
    ResourcesUnsubscribe = "resources/unsubscribe",
    /// `prompts/list`
    PromptsList = "prompts/list",
    /// `prompts/get`
    PromptsGet = "prompts/get",
    /// `completion/complete`
    CompletionComplete = "completion/complete",
    /// `logging/setLevel`
    LoggingSetLevel = "logging/setLevel",
    /// `tasks/get`
    TasksGet = "tasks/get",
    /// `tasks/result`
    TasksResult = "tasks/result",
    /// `tasks/list`
    TasksList = "tasks/list",
    /// `tasks/cancel`
    TasksCancel = "tasks/cancel",
    /// `notifications/initialized`
    NotificationsInitialized = "notifications/initialized",
    /// `notifications/cancelled`
    NotificationsCancelled = "notifications/cancelled",
    /// `notifications/progress`
    NotificationsProgress = "notifications/progress",
    /// `notifications/roots/list_changed`
    NotificationsRootsListChanged = "notifications/roots/list_changed",
    /// `notifications/tasks/status`
    NotificationsTasksStatus = "notifications/tasks/status",
}

/// The longest name in the list, in bytes.
const LONGEST: usize = "notifications/roots/list_changed".len();

impl McpMethod {
    /// The method a JSON string token (quotes included) names, decoded as
    /// servers decode it. A plainly written name is matched in place; an
    /// escaped one is decoded only when it is short enough to be a name of
    /// the list (every character escaped as `\uXXXX` is six bytes), so a
    /// client's megabyte-long method costs nothing. Never fails: a token
    /// that is no string, or no UTF-8, is [`Other`](Self::Other).
    pub(crate) fn from_token(token: &[u8]) -> Self {
        if let Some(text) = plain_string(token) {
            return Self::from_name(text);
        }
        if token.len() > LONGEST * 6 + 2 || token.first() != Some(&b'"') {
            return Self::Other;
        }
        match serde_json::from_slice::<Cow<'_, str>>(token) {
            Ok(name) => Self::from_name(name.as_bytes()),
            Err(_) => Self::Other,
        }
    }
}

impl std::fmt::Display for McpMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::McpMethod;

    #[test]
    fn every_name_reads_back() {
        for method in McpMethod::ALL {
            let token = format!("\"{}\"", method.as_str());
            let expected = if *method == McpMethod::Other {
                // `"other"` is no MCP method.
                McpMethod::Other
            } else {
                *method
            };
            assert_eq!(McpMethod::from_token(token.as_bytes()), expected);
        }
        assert!(McpMethod::ALL
            .iter()
            .all(|method| method.as_str().len() <= super::LONGEST));
    }

    #[test]
    fn escaped_names_count_as_the_name_they_decode_to() {
        for (token, method) in [
            (r#""tools\/call""#, McpMethod::ToolsCall),
            (r#""tools\u002fcall""#, McpMethod::ToolsCall),
            (r#""\u0070\u0069\u006e\u0067""#, McpMethod::Ping),
            // Every character escaped: the longest name still decodes.
            (
                &format!(
                    "\"{}\"",
                    "notifications/roots/list_changed"
                        .bytes()
                        .map(|byte| format!("\\u{byte:04x}"))
                        .collect::<String>()
                ),
                McpMethod::NotificationsRootsListChanged,
            ),
        ] {
            assert_eq!(McpMethod::from_token(token.as_bytes()), method, "{token}");
        }
    }

    #[test]
    fn anything_else_is_other() {
        let long = format!("\"{}\"", "\\u0061".repeat(10_000));
        for token in [
            r#""tools/List""#,
            r#""tools/list ""#,
            r#""sampling/createMessage""#,
            r#""""#,
            r#""\ud800""#,
            r#""tools\/list"#,
            "tools/list",
            "17",
            "",
            "\"tools/list\u{0}\"",
            long.as_str(),
        ] {
            assert_eq!(
                McpMethod::from_token(token.as_bytes()),
                McpMethod::Other,
                "{token:?}"
            );
        }
        assert_eq!(McpMethod::from_token(b"\"\xff\""), McpMethod::Other);
    }
}
