//! The SSE rewriter fed arbitrary bytes in arbitrary chunkings; see
//! `mcp_id_guard_fuzz::sse_rewriter` for the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The bugs these checks know (`KnownBug`) are fixed: one that comes back
    // is a finding too.
    if let Err(bug) = mcp_id_guard_fuzz::sse_rewriter::check(data) {
        panic!("known bug is back: {bug:?}");
    }
});
