//! The SSE rewriter fed arbitrary bytes in arbitrary chunkings; see
//! `mcp_id_guard_fuzz::sse_rewriter` for the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Inputs that show a known, reported crate bug return it instead of
    // panicking, so the run goes on looking for new ones.
    let _ = mcp_id_guard_fuzz::sse_rewriter::check(data);
});
