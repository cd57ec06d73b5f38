//! The block index under [`super::nested`]: it reads a nested value 64 bytes
//! at a time, the way simdjson's first stage does. Per block it takes masks
//! of quotes, backslashes and the counted bracket pair (16 bytes per compare
//! through `wide`, which maps to SSE2 or NEON), marks the bytes a backslash
//! escapes by the parity of each backslash run, the bytes inside strings by a
//! prefix XOR of the unescaped quotes, and follows the brackets outside
//! strings bit by bit: a dense value (many short strings and small
//! objects) then costs a few instructions per byte instead of a search per
//! token.
//!
//! The byte path skips a backslash outside a string as any other byte; the
//! masks would take it as an escape. So a block whose masks put a backslash
//! outside a string is left to the byte path (it is not JSON anyway): in
//! every other block both read the same strings, because a run of
//! backslashes inside a string escapes by its parity in both.

use wide::u8x16;

/// Bytes per block: one bit each in a `u64` mask.
pub(super) const BLOCK: usize = 64;

/// Odd bit positions, for the parity of backslash runs.
const ODD_BITS: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// Where a nested value's reading stands between bytes: the same state the
/// byte path keeps, so either can take over from the other at any byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Nest {
    /// The bracket pair counted: `{}` inside an object, `[]` inside an array.
    pub(super) open: u8,
    pub(super) close: u8,
    /// Brackets open, the value's own included.
    pub(super) depth: usize,
    /// Inside a string.
    pub(super) in_string: bool,
    /// The previous byte was a backslash that escapes the next one.
    pub(super) escape: bool,
}

/// How reading blocks stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The value closed just before this offset.
    Closed(usize),
    /// Fewer than a block's bytes are left from this offset.
    Short(usize),
    /// The block at this offset holds a backslash outside a string: the byte
    /// path reads it.
    Bytes(usize),
    /// The block just read, up to this offset, lay inside one string without
    /// an escape: maybe a long string, which memchr reads faster than blocks
    /// do as long as its escapes are far apart.
    LongString(usize),
}

/// The masks of one block: bit `i` for byte `i`.
struct Masks {
    quote: u64,
    backslash: u64,
    open: u64,
    close: u64,
}

impl Masks {
    fn of(block: &[u8; BLOCK], open: u8, close: u8) -> Self {
        let (quote_byte, backslash_byte) = (u8x16::splat(b'"'), u8x16::splat(b'\\'));
        let (open_byte, close_byte) = (u8x16::splat(open), u8x16::splat(close));
        let mut masks = Masks {
            quote: 0,
            backslash: 0,
            open: 0,
            close: 0,
        };
        for (lane, bytes) in block.chunks_exact(16).enumerate() {
            let mut array = [0; 16];
            array.copy_from_slice(bytes);
            let bytes = u8x16::new(array);
            // `move_mask` gives one bit per byte, in its low 16 bits.
            let bits = |class: u8x16| u64::from(bytes.cmp_eq(class).move_mask() as u16);
            let shift = 16 * lane;
            masks.quote |= bits(quote_byte) << shift;
            masks.backslash |= bits(backslash_byte) << shift;
            masks.open |= bits(open_byte) << shift;
            masks.close |= bits(close_byte) << shift;
        }
        masks
    }
}

/// The bytes escaped by a backslash (escaped backslashes included), given
/// the backslashes and whether the block's first byte is escaped; and
/// whether the byte after the block is.
///
/// A run of backslashes escapes every other byte from its second on: a run
/// starting at an even offset escapes the odd offsets, one at an odd offset
/// the even ones. Subtracting each run's start from a mask of odd bits with
/// the run shifted in flips, by the borrow running through the run, exactly
/// the bits of the bytes the run escapes (simdjson's escape scanner).
pub(super) fn escaped(backslash: u64, first_escaped: bool) -> (u64, bool) {
    let carried = u64::from(first_escaped);
    if backslash == 0 {
        return (carried, false);
    }
    // An escaped backslash escapes nothing.
    let potential = backslash & !carried;
    let codes = (((potential << 1) | ODD_BITS).wrapping_sub(potential)) ^ ODD_BITS;
    let escaped = codes ^ (backslash | carried);
    let escaping = codes & backslash;
    (escaped, escaping >> 63 == 1)
}

/// Bit `i` set when an odd number of bits up to `i` (included) are set.
pub(super) fn prefix_xor(mut bits: u64) -> u64 {
    bits ^= bits << 1;
    bits ^= bits << 2;
    bits ^= bits << 4;
    bits ^= bits << 8;
    bits ^= bits << 16;
    bits ^= bits << 32;
    bits
}

impl Nest {
    /// Reads `chunk` from `at` block by block, until the value closes, fewer
    /// than a block's bytes are left, or a block must go elsewhere.
    pub(super) fn blocks(&mut self, chunk: &[u8], mut at: usize) -> Stop {
        while let Some(block) = chunk.get(at..at + BLOCK) {
            let block: &[u8; BLOCK] = block.try_into().expect("a block's bytes");
            let masks = Masks::of(block, self.open, self.close);
            let (escaped, escape_after) = escaped(masks.backslash, self.escape);
            let quotes = masks.quote & !escaped;
            // Opening quotes are inside, closing ones outside.
            let inside = prefix_xor(quotes) ^ if self.in_string { u64::MAX } else { 0 };
            if masks.backslash & !inside != 0 {
                return Stop::Bytes(at);
            }
            let opens = masks.open & !inside;
            let closes = masks.close & !inside;
            // Brackets outside strings are few per block even in dense
            // JSON, and `count_ones` is a dozen instructions on x86-64
            // without POPCNT: follow them one by one, in order.
            let mut brackets = opens | closes;
            while brackets != 0 {
                let bit = brackets & brackets.wrapping_neg();
                if opens & bit != 0 {
                    self.depth += 1;
                } else {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.in_string = false;
                        self.escape = false;
                        return Stop::Closed(at + bit.trailing_zeros() as usize + 1);
                    }
                }
                brackets &= brackets - 1;
            }
            let long_string = self.in_string && quotes == 0 && masks.backslash == 0;
            self.in_string = inside >> 63 == 1;
            self.escape = escape_after;
            at += BLOCK;
            if long_string {
                return Stop::LongString(at);
            }
        }
        Stop::Short(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The escapes, backslash by backslash, as the byte path finds them.
    fn escaped_one_by_one(backslash: u64, first_escaped: bool) -> (u64, bool) {
        let mut escaped = 0;
        let mut escape = first_escaped;
        for bit in 0..64 {
            if escape {
                escaped |= 1 << bit;
                escape = false;
            } else if backslash >> bit & 1 == 1 {
                escape = true;
            }
        }
        (escaped, escape)
    }

    fn prefix_xor_one_by_one(bits: u64) -> u64 {
        let mut inside = false;
        let mut out = 0;
        for bit in 0..64 {
            inside ^= bits >> bit & 1 == 1;
            out |= u64::from(inside) << bit;
        }
        out
    }

    /// Backslash masks with runs of every length, at block edges too.
    fn runs() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<u64>(),
            (any::<u64>(), any::<u64>()).prop_map(|(a, b)| a | b),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(a, b, c)| a | b | c),
            (0..64u32, 0..=64u32).prop_map(|(start, len)| {
                let run = if len == 64 { u64::MAX } else { (1 << len) - 1 };
                run << start
            }),
            Just(u64::MAX),
            Just(1 << 63),
            Just(3 << 62),
        ]
    }

    proptest! {
        #[test]
        fn escapes_match_one_by_one(backslash in runs(), first in any::<bool>()) {
            prop_assert_eq!(escaped(backslash, first), escaped_one_by_one(backslash, first));
        }

        #[test]
        fn prefix_xor_matches_one_by_one(bits in any::<u64>()) {
            prop_assert_eq!(prefix_xor(bits), prefix_xor_one_by_one(bits));
        }
    }

    #[test]
    fn masks_mark_each_class() {
        let mut block = [b'x'; BLOCK];
        for (at, byte) in [(0, b'"'), (15, b'\\'), (16, b'{'), (31, b'}'), (63, b'"')] {
            block[at] = byte;
        }
        let masks = Masks::of(&block, b'{', b'}');
        assert_eq!(masks.quote, 1 | 1 << 63);
        assert_eq!(masks.backslash, 1 << 15);
        assert_eq!(masks.open, 1 << 16);
        assert_eq!(masks.close, 1 << 31);
    }
}
