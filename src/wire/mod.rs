//! Bytes on the wire: the JSON scanner, the JSON-RPC envelope it reads, ids
//! and their server-side form, the edits that splice them, restoring client
//! ids in responses (JSON and SSE), the protocol's facts, and the one
//! builder of the guard's own JSON-RPC answers. Nothing here knows about
//! sessions or services.

pub(crate) mod answer;
pub(crate) mod edit;
pub(crate) mod envelope;
pub(crate) mod id;
pub(crate) mod method;
pub(crate) mod protocol;
pub(crate) mod restore;
pub(crate) mod scan;
pub(crate) mod sse;
