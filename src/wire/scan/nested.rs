//! Skipping a nested object or array to its end: blocks where the value is
//! dense, memchr where it is one long string, and the byte path for what
//! neither takes (the last bytes of a chunk, a block with a backslash
//! outside a string). The three keep one state ([`Nest`]), so each takes
//! over from the others at any byte, in any chunking.

use super::blocks::{Nest, Stop, BLOCK};
use super::{find2, find3};

/// How far apart, in bytes, the escapes of a long string must be for memchr
/// to keep reading it.
const FAR: usize = 4 * BLOCK;

impl Nest {
    /// Reads `chunk` from `at`: the offset just after the value's closing
    /// bracket, or `None` when the chunk ended first.
    pub(super) fn skip(&mut self, chunk: &[u8], mut at: usize) -> Option<usize> {
        while at < chunk.len() {
            let until = match self.blocks(chunk, at) {
                Stop::Closed(end) => return Some(end),
                Stop::Short(from) => {
                    at = from;
                    chunk.len()
                }
                Stop::Bytes(from) => {
                    at = from;
                    from + BLOCK
                }
                Stop::LongString(from) => {
                    // memchr over the rest of the string, then blocks again;
                    // blocks sooner where escapes come within a few blocks
                    // of each other (a text with line breaks, a document
                    // quoted in a string): a search and its setup cost about
                    // as much as reading 100 bytes in blocks (callgrind,
                    // benches/dense_cpu.sh, the text shape).
                    at = from;
                    while self.in_string && at < chunk.len() {
                        let escaped_byte = self.escape;
                        let next = self.string_step(chunk, at);
                        let near = next - at <= FAR;
                        at = next;
                        if near && !escaped_byte {
                            break;
                        }
                    }
                    continue;
                }
            };
            if let Some(end) = self.bytes(&chunk[..until], at) {
                return Some(end);
            }
            at = until;
        }
        None
    }

    /// The byte path: reads `haystack` from `at` one token at a time.
    pub(super) fn bytes(&mut self, haystack: &[u8], mut at: usize) -> Option<usize> {
        while at < haystack.len() {
            if self.in_string {
                at = self.string_step(haystack, at);
                continue;
            }
            let found = find3(b'"', self.open, self.close, &haystack[at..])?;
            let byte = haystack[at + found];
            at += found + 1;
            if byte == b'"' {
                self.in_string = true;
            } else if byte == self.open {
                self.depth += 1;
            } else {
                self.depth -= 1;
                if self.depth == 0 {
                    return Some(at);
                }
            }
        }
        None
    }

    /// Reads inside a string from `at` to its next quote or backslash (or
    /// the end of `haystack`); returns where to go on.
    fn string_step(&mut self, haystack: &[u8], at: usize) -> usize {
        if self.escape {
            self.escape = false;
            return at + 1;
        }
        match find2(b'"', b'\\', &haystack[at..]) {
            None => haystack.len(),
            Some(found) => {
                if haystack[at + found] == b'\\' {
                    self.escape = true;
                } else {
                    self.in_string = false;
                }
                at + found + 1
            }
        }
    }
}
