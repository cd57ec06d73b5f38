//! A reverse proxy service: [`IdGuardLayer`](crate::IdGuardLayer) in front of an
//! MCP server reached over HTTP, for servers written in any language.
