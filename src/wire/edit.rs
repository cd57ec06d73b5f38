//! Byte edits: how the guard changes a message without re-serializing it.
//! The request path splices server-side ids (and cancellation targets) into
//! a body; the response path splices client ids back.

use std::ops::Range;
use std::sync::Arc;

/// A byte range of a message and the bytes that replace it: a server-side
/// id, shared with the table that keeps it (not copied per edit).
pub(crate) type Edit = (Range<usize>, Arc<[u8]>);

/// Copies `input` with each `(range, replacement)` spliced in. Ranges must be
/// sorted and disjoint (they are: they come from distinct messages in order).
pub(crate) fn splice(input: &[u8], edits: &[Edit]) -> Vec<u8> {
    let added: usize = edits.iter().map(|(_, new)| new.len()).sum();
    let mut out = Vec::with_capacity(input.len() + added);
    let mut cursor = 0;
    for (range, replacement) in edits {
        out.extend_from_slice(&input[cursor..range.start]);
        out.extend_from_slice(replacement);
        cursor = range.end;
    }
    out.extend_from_slice(&input[cursor..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_ranges() {
        let out = splice(
            b"abcdef",
            &[(1..2, Arc::from(&b"XY"[..])), (4..6, Arc::from(&b""[..]))],
        );
        assert_eq!(out, b"aXYcd");
    }
}
