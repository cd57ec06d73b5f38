//! Arbitrary requests (bodies and headers) through `IdGuard` in front of a
//! recording echo service; see `mcp_id_guard_fuzz::request_path` for the
//! invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The bugs these checks know (`KnownBug`) are fixed: one that comes back
    // is a finding too.
    if let Err(bug) = mcp_id_guard_fuzz::request_path::check(data) {
        panic!("known bug is back: {bug:?}");
    }
});
