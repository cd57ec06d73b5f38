//! A tiny reader that turns fuzz bytes into choices. Exhausted input reads
//! as zeros, so every byte string is a valid program.

/// Fuzz bytes being consumed front to back.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, or 0.
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    /// A number below `bound` (which must not be 0).
    pub fn below(&mut self, bound: usize) -> usize {
        usize::from(self.byte()) % bound
    }

    /// A 16-bit number.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// A coin flip.
    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// Up to `max` raw bytes (length from one byte).
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let wanted = self.below(max + 1).min(self.data.len());
        let (taken, rest) = self.data.split_at(wanted);
        self.data = rest;
        taken
    }

    /// Everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    /// Picks one of `options`.
    pub fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[self.below(options.len())]
    }

    /// Sorted cut points in `0..=len` (at most `max`), for chunking.
    pub fn cuts(&mut self, len: usize, max: usize) -> Vec<usize> {
        let count = self.below(max + 1);
        let mut cuts: Vec<usize> = (0..count)
            .map(|_| usize::from(self.u16()) % (len + 1))
            .collect();
        cuts.sort_unstable();
        cuts
    }
}

/// Splits `bytes` at sorted `cuts` (empty pieces included).
pub fn split_at_cuts<'b>(bytes: &'b [u8], cuts: &[usize]) -> Vec<&'b [u8]> {
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for &cut in cuts {
        let cut = cut.clamp(start, bytes.len());
        pieces.push(&bytes[start..cut]);
        start = cut;
    }
    pieces.push(&bytes[start..]);
    pieces
}

/// Ids worth trying: valid MCP ids in several spellings, numbers the spec
/// does not allow, every string escape, nested and forged server-side ids,
/// non-scalars.
pub const ID_POOL: &[&str] = &[
    "1",
    "\"1\"",
    "\"\\u0031\"",
    "0",
    "-0",
    "\"0\"",
    "2",
    "1e3",
    "1.5",
    "-1",
    "18446744073709551616",
    "-9223372036854775809",
    "\"a\"",
    "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0000\"",
    "\"\\ud83d\\ude00\"",
    "\"\u{1F600}\"",
    "\"\u{fc}\"",
    "\"mcp-id-guard:0123456789abcdef:7:1\"",
    "\"mcp-id-guard:\"",
    "\"\\u006dcp-id-guard:0123456789abcdef:7:1\"",
    "[1, 2]",
    "[1,\n2]",
    "{\"a\": 1}",
    "true",
    "\"\"",
];

/// Number spellings servers read as one value (`1`, `0`, `1.5`), and ids
/// servers read differently (the guard refuses them): big integers, long
/// fractions, extreme exponents, `NaN`, lone surrogates, non-scalars.
pub const SPELLINGS: &[&str] = &[
    "1.0",
    "1e0",
    "10e-1",
    "0.1e1",
    "1E+0",
    "100e-2",
    "-0.0",
    "0e5",
    "\"1.0\"",
    "1.5",
    "15e-1",
    "0.015e2",
    "9007199254740991",
    "-9007199254740991",
    "9007199254740992",
    "-9007199254740993",
    "1e16",
    "1.0000000000000001",
    "1e400",
    "1e-400",
    "1e0000001",
    "NaN",
    "Infinity",
    "-Infinity",
    "\"\\ud800\"",
    "\"\\udc00\\ud800\"",
    "false",
    "{}",
    "01",
    "1.",
];

/// An id's JSON text: mostly from [`ID_POOL`], else the fuzz bytes if they
/// are one JSON value, else those bytes as a JSON string.
pub fn id_text(input: &mut Input<'_>) -> String {
    match input.below(8) {
        // The first ids collide with each other: 1, "1", "\u0031".
        0..=3 => return input.pick(&ID_POOL[..6]).to_owned(),
        4..=5 => return input.pick(ID_POOL).to_owned(),
        _ => {}
    }
    fuzz_id(input)
}

/// A request id's JSON text, as a client may write it: like [`id_text`],
/// and one time in eight a spelling from [`SPELLINGS`] (not all of them
/// JSON: the guard must refuse those). The SSE target keeps [`id_text`]:
/// servers echo only ids the guard let through.
pub fn request_id_text(input: &mut Input<'_>) -> String {
    match input.below(8) {
        0..=2 => input.pick(&ID_POOL[..6]).to_owned(),
        3 => input.pick(SPELLINGS).to_owned(),
        4..=5 => input.pick(ID_POOL).to_owned(),
        _ => fuzz_id(input),
    }
}

/// The fuzz bytes if they are one JSON value, else those bytes as a JSON
/// string.
fn fuzz_id(input: &mut Input<'_>) -> String {
    let bytes = input.bytes(12);
    if let Ok(text) = std::str::from_utf8(bytes) {
        let trimmed = !text.is_empty()
            && !super::oracle::is_json_whitespace(bytes[0])
            && !super::oracle::is_json_whitespace(bytes[bytes.len() - 1]);
        if trimmed && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
            return text.to_owned();
        }
    }
    serde_json::to_string(&String::from_utf8_lossy(bytes)).expect("a string serializes")
}
