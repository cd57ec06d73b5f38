//! The differential half of the oracle: how real servers' JSON readers see a
//! body, written without the crate. Each [`Dialect`] is one reader the guard
//! may front (the lenient readings measured against the live servers, see
//! the protocol notes, "Where real servers read more than a strict reader"):
//!
//! - [`LAST_WINS`]: Python's `json.loads` on the request's bytes (the Python
//!   SDK): a UTF-8 byte order mark skipped, UTF-16 and UTF-32 detected and
//!   decoded, UTF-8 decoded with `surrogatepass`, `NaN` and `Infinity`
//!   accepted, lone surrogate escapes kept, a repeated key keeps the last
//!   value (as JavaScript's `JSON.parse` does too);
//! - [`FIRST_WINS`]: the same, but a repeated key keeps the first value;
//! - [`JAVASCRIPT`]: `Request.json()` in a JavaScript server (Node 20's
//!   undici drops up to two byte order marks, measured), invalid UTF-8
//!   replaced by U+FFFD, no `NaN`, the last of a repeated key wins; and
//!   Express's `express.json()`, which inflates `gzip` and `deflate` bodies
//!   (measured with Express 4);
//! - [`STRICT`]: serde_json into typed messages (rmcp): UTF-8 only, no
//!   byte order mark, lone surrogates refused, a repeated key in a message
//!   (or in a cancellation's `params`) refuses the body.
//!
//! A reading is the list of messages a server sees, each with its kind and
//! the values of its `id` and (for a cancellation) `params.requestId`. The
//! guard must track every request any reading sees under that id's key, or
//! answer the body itself.

/// How a reader treats a key that appears twice in one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicates {
    /// The last value wins (Python, JavaScript).
    Last,
    /// The first value wins.
    First,
    /// The body is refused (serde's derived structs).
    Refuse,
}

/// How a reader decodes bytes that are not valid UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadUtf8 {
    /// The body is refused.
    Refuse,
    /// Encoded surrogates (`ED A0 80`) decode to lone surrogates, anything
    /// else invalid refuses (Python's `surrogatepass`).
    SurrogatePass,
    /// Each bad sequence becomes U+FFFD (the WHATWG decoder).
    Replace,
}

/// One server's JSON reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// A name for messages.
    pub name: &'static str,
    /// How many leading UTF-8 byte order marks it skips.
    pub utf8_boms: usize,
    /// Detects UTF-16 and UTF-32 as Python's `json.detect_encoding` does.
    pub wide: bool,
    /// Invalid UTF-8.
    pub bad_utf8: BadUtf8,
    /// Accepts `NaN`, `Infinity` and `-Infinity`.
    pub non_finite: bool,
    /// Accepts `\uD800` escapes that do not form a pair.
    pub lone_surrogates: bool,
    /// A key twice in one object.
    pub duplicates: Duplicates,
    /// Nesting beyond this refuses the body.
    pub max_depth: usize,
}

/// Python's `json.loads` (the Python SDK), JavaScript's last-wins keys.
pub const LAST_WINS: Dialect = Dialect {
    name: "last-wins",
    utf8_boms: 1,
    wide: true,
    bad_utf8: BadUtf8::SurrogatePass,
    non_finite: true,
    lone_surrogates: true,
    duplicates: Duplicates::Last,
    max_depth: 900,
};

/// As [`LAST_WINS`], the first of a repeated key winning.
pub const FIRST_WINS: Dialect = Dialect {
    name: "first-wins",
    duplicates: Duplicates::First,
    ..LAST_WINS
};

/// `Request.json()` / `JSON.parse` in a JavaScript server (Node 20 drops two
/// byte order marks; Express one).
pub const JAVASCRIPT: Dialect = Dialect {
    name: "javascript",
    utf8_boms: 2,
    wide: false,
    bad_utf8: BadUtf8::Replace,
    non_finite: false,
    lone_surrogates: true,
    duplicates: Duplicates::Last,
    max_depth: 5_000,
};

/// serde_json into typed messages (rmcp).
pub const STRICT: Dialect = Dialect {
    name: "strict",
    utf8_boms: 0,
    wide: false,
    bad_utf8: BadUtf8::Refuse,
    non_finite: false,
    lone_surrogates: false,
    duplicates: Duplicates::Refuse,
    max_depth: 128,
};

/// Every reading the oracle compares the guard with.
pub const DIALECTS: [Dialect; 4] = [LAST_WINS, FIRST_WINS, JAVASCRIPT, STRICT];

/// A JSON value as a reader holds it. Strings are UTF-16 code units, so lone
/// surrogates fit; numbers keep their text.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number's text (`NaN` and `Infinity` too, where accepted).
    Number(String),
    /// A string's code units.
    String(Vec<u16>),
    /// An array.
    Array(Vec<Value>),
    /// An object's members in order, repeated keys included.
    Object(Vec<(Vec<u16>, Value)>),
}

impl Value {
    /// The string's text, if it is a string of valid Unicode.
    pub fn text(&self) -> Option<String> {
        match self {
            Value::String(units) => String::from_utf16(units).ok(),
            _ => None,
        }
    }
}

/// A member of an object as `dialect` reads it: `Err` when the key is
/// repeated and the dialect refuses that.
fn member<'v>(
    members: &'v [(Vec<u16>, Value)],
    key: &str,
    duplicates: Duplicates,
) -> Result<Option<&'v Value>, ()> {
    let key: Vec<u16> = key.encode_utf16().collect();
    let mut found = members
        .iter()
        .filter(|(name, _)| *name == key)
        .map(|(_, value)| value);
    let first = found.next();
    let last = found.next_back();
    match (duplicates, last) {
        (Duplicates::Refuse, Some(_)) => Err(()),
        (Duplicates::Last, Some(last)) => Ok(Some(last)),
        _ => Ok(first),
    }
}

/// Whether an object has a key twice.
pub fn has_repeated_key(members: &[(Vec<u16>, Value)]) -> bool {
    let mut seen = std::collections::HashSet::new();
    members.iter().any(|(key, _)| !seen.insert(key))
}

/// What one message is to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string `method` and a non-null `id`.
    Request,
    /// A string `method`, no id (or `null`).
    Notification,
    /// Anything else.
    Other,
}

/// One message as a server reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// Its kind.
    pub kind: Kind,
    /// A request's id.
    pub id: Option<Value>,
    /// The decoded method.
    pub method: Option<String>,
    /// A `notifications/cancelled`'s non-null `params.requestId`.
    pub cancels: Option<Value>,
}

/// A body as one server reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// An array at the top.
    pub batch: bool,
    /// One entry per message (per array element in a batch).
    pub messages: Vec<Seen>,
}

impl Reading {
    /// The requests' ids, in order.
    pub fn request_ids(&self) -> impl Iterator<Item = &Value> {
        self.messages
            .iter()
            .filter(|seen| seen.kind == Kind::Request)
            .filter_map(|seen| seen.id.as_ref())
    }
}

/// How `dialect` reads `body` as JSON-RPC; `None` when it refuses the body
/// (not JSON to it, or refused by its typed reading).
pub fn read(body: &[u8], dialect: Dialect) -> Option<Reading> {
    let value = parse(body, dialect)?;
    let (batch, elements) = match value {
        Value::Array(elements) => (true, elements),
        object @ Value::Object(_) => (false, vec![object]),
        _ => return Some(Reading::default_empty()),
    };
    let mut messages = Vec::with_capacity(elements.len());
    for element in &elements {
        let Value::Object(members) = element else {
            messages.push(Seen::other());
            continue;
        };
        messages.push(message(members, dialect)?);
    }
    Some(Reading { batch, messages })
}

/// One object as `dialect` reads it as a JSON-RPC message; `None` when the
/// dialect refuses it.
pub fn message(members: &[(Vec<u16>, Value)], dialect: Dialect) -> Option<Seen> {
    if dialect.duplicates == Duplicates::Refuse && has_repeated_key(members) {
        return None;
    }
    let get = |key| member(members, key, dialect.duplicates);
    let method = match get("method").ok()? {
        Some(Value::String(units)) => Some(String::from_utf16_lossy(units)),
        _ => None,
    };
    let id = get("id").ok()?.filter(|id| **id != Value::Null).cloned();
    let kind = match (&method, &id) {
        (Some(_), Some(_)) => Kind::Request,
        (Some(_), None) => Kind::Notification,
        _ => Kind::Other,
    };
    let mut cancels = None;
    if kind == Kind::Notification && method.as_deref() == Some("notifications/cancelled") {
        if let Some(Value::Object(params)) = get("params").ok()? {
            if dialect.duplicates == Duplicates::Refuse && has_repeated_key(params) {
                return None;
            }
            cancels = member(params, "requestId", dialect.duplicates)
                .ok()?
                .filter(|id| **id != Value::Null)
                .cloned();
        }
    }
    Some(Seen {
        kind,
        id: id.filter(|_| kind == Kind::Request),
        method,
        cancels,
    })
}

impl Reading {
    fn default_empty() -> Self {
        Self {
            batch: false,
            messages: Vec::new(),
        }
    }
}

impl Seen {
    fn other() -> Self {
        Self {
            kind: Kind::Other,
            id: None,
            method: None,
            cancels: None,
        }
    }
}

/// Parses `body` as one JSON text the way `dialect` does; `None` when it
/// refuses it.
pub fn parse(body: &[u8], dialect: Dialect) -> Option<Value> {
    let text = decode(body, dialect)?;
    let mut parser = Parser {
        text: &text,
        at: 0,
        dialect,
        depth: 0,
    };
    parser.whitespace();
    let value = parser.value()?;
    parser.whitespace();
    (parser.at == text.len()).then_some(value)
}

/// The body's characters as `dialect` decodes it (code points; lone
/// surrogates kept as such).
fn decode(body: &[u8], dialect: Dialect) -> Option<Vec<u32>> {
    let mut body = body;
    if dialect.wide {
        if let Some(text) = decode_wide(body) {
            return text;
        }
    }
    for _ in 0..dialect.utf8_boms {
        body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    }
    decode_utf8(body, dialect.bad_utf8)
}

/// Python's `json.detect_encoding`: `Some` when it picks UTF-16 or UTF-32
/// (with the decoded text, `None` inside when decoding fails).
fn decode_wide(body: &[u8]) -> Option<Option<Vec<u32>>> {
    #[derive(Clone, Copy)]
    enum Wide {
        Utf16 { big: bool },
        Utf32 { big: bool },
    }
    let (wide, skip) = if body.starts_with(b"\x00\x00\xFE\xFF") {
        (Wide::Utf32 { big: true }, 4)
    } else if body.starts_with(b"\xFF\xFE\x00\x00") {
        (Wide::Utf32 { big: false }, 4)
    } else if body.starts_with(b"\xFE\xFF") {
        (Wide::Utf16 { big: true }, 2)
    } else if body.starts_with(b"\xFF\xFE") {
        (Wide::Utf16 { big: false }, 2)
    } else if body.starts_with(b"\xEF\xBB\xBF") {
        return None;
    } else if body.len() >= 4 {
        match (body[0], body[1], body[2], body[3]) {
            (0, 0, _, _) => (Wide::Utf32 { big: true }, 0),
            (0, _, _, _) => (Wide::Utf16 { big: true }, 0),
            (_, 0, 0, 0) => (Wide::Utf32 { big: false }, 0),
            (_, 0, _, _) => (Wide::Utf16 { big: false }, 0),
            _ => return None,
        }
    } else if body.len() == 2 && body[0] == 0 {
        (Wide::Utf16 { big: true }, 0)
    } else if body.len() == 2 && body[1] == 0 {
        (Wide::Utf16 { big: false }, 0)
    } else {
        return None;
    };
    let body = &body[skip..];
    let decoded = match wide {
        Wide::Utf16 { big } => {
            if !body.chunks_exact(2).remainder().is_empty() {
                return Some(None);
            }
            let units: Vec<u16> = body
                .chunks(2)
                .map(|pair| {
                    let pair = [pair[0], pair[1]];
                    if big {
                        u16::from_be_bytes(pair)
                    } else {
                        u16::from_le_bytes(pair)
                    }
                })
                .collect();
            // `surrogatepass`: lone surrogates stay.
            char::decode_utf16(units.iter().copied())
                .map(|unit| match unit {
                    Ok(character) => u32::from(character),
                    Err(lone) => u32::from(lone.unpaired_surrogate()),
                })
                .collect()
        }
        Wide::Utf32 { big } => {
            if !body.chunks_exact(4).remainder().is_empty() {
                return Some(None);
            }
            let mut points = Vec::with_capacity(body.len() / 4);
            for quad in body.chunks(4) {
                let quad = [quad[0], quad[1], quad[2], quad[3]];
                let point = if big {
                    u32::from_be_bytes(quad)
                } else {
                    u32::from_le_bytes(quad)
                };
                if point > 0x10FFFF {
                    return Some(None);
                }
                points.push(point);
            }
            points
        }
    };
    Some(Some(decoded))
}

fn decode_utf8(body: &[u8], bad: BadUtf8) -> Option<Vec<u32>> {
    let mut points = Vec::with_capacity(body.len());
    let mut rest = body;
    loop {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                points.extend(text.chars().map(u32::from));
                return Some(points);
            }
            Err(error) => {
                let (good, bad_part) = rest.split_at(error.valid_up_to());
                let good = std::str::from_utf8(good).expect("valid up to here");
                points.extend(good.chars().map(u32::from));
                let width = error.error_len().unwrap_or(bad_part.len());
                match bad {
                    BadUtf8::Refuse => return None,
                    BadUtf8::Replace => {
                        points.push(0xFFFD);
                        rest = &bad_part[width.max(1)..];
                    }
                    BadUtf8::SurrogatePass => {
                        // An encoded surrogate: ED A0..BF 80..BF.
                        match bad_part {
                            [0xED, second @ 0xA0..=0xBF, third @ 0x80..=0xBF, ..] => {
                                let point = 0xD000
                                    | (u32::from(second & 0x3F) << 6)
                                    | u32::from(third & 0x3F);
                                points.push(point);
                                rest = &bad_part[3..];
                            }
                            _ => return None,
                        }
                    }
                }
            }
        }
    }
}

struct Parser<'t> {
    text: &'t [u32],
    at: usize,
    dialect: Dialect,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u32> {
        self.text.get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(0x20 | 0x09 | 0x0A | 0x0D)) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &str) -> bool {
        let matches = word.chars().enumerate().all(|(offset, character)| {
            self.text.get(self.at + offset) == Some(&u32::from(character))
        });
        if matches {
            self.at += word.len();
        }
        matches
    }

    fn value(&mut self) -> Option<Value> {
        match char::from_u32(self.peek()?)? {
            '{' => self.nested(true),
            '[' => self.nested(false),
            '"' => self.string().map(Value::String),
            't' if self.literal("true") => Some(Value::Bool(true)),
            'f' if self.literal("false") => Some(Value::Bool(false)),
            'n' if self.literal("null") => Some(Value::Null),
            'N' if self.dialect.non_finite && self.literal("NaN") => {
                Some(Value::Number("NaN".to_owned()))
            }
            'I' if self.dialect.non_finite && self.literal("Infinity") => {
                Some(Value::Number("Infinity".to_owned()))
            }
            '-' if self.dialect.non_finite && self.literal("-Infinity") => {
                Some(Value::Number("-Infinity".to_owned()))
            }
            '-' | '0'..='9' => self.number().map(Value::Number),
            _ => None,
        }
    }

    fn nested(&mut self, object: bool) -> Option<Value> {
        self.depth += 1;
        if self.depth > self.dialect.max_depth {
            return None;
        }
        self.at += 1;
        let close = u32::from(if object { '}' } else { ']' });
        let mut members = Vec::new();
        let mut elements = Vec::new();
        self.whitespace();
        if self.peek() == Some(close) {
            self.at += 1;
        } else {
            loop {
                self.whitespace();
                if object {
                    if self.peek() != Some(u32::from('"')) {
                        return None;
                    }
                    let key = self.string()?;
                    self.whitespace();
                    if self.peek() != Some(u32::from(':')) {
                        return None;
                    }
                    self.at += 1;
                    self.whitespace();
                    let value = self.value()?;
                    members.push((key, value));
                } else {
                    elements.push(self.value()?);
                }
                self.whitespace();
                match self.peek() {
                    Some(comma) if comma == u32::from(',') => self.at += 1,
                    Some(end) if end == close => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(if object {
            Value::Object(members)
        } else {
            Value::Array(elements)
        })
    }

    fn number(&mut self) -> Option<String> {
        let start = self.at;
        let digit = |point: Option<u32>| point.is_some_and(|p| (0x30..=0x39).contains(&p));
        if self.peek() == Some(u32::from('-')) {
            self.at += 1;
        }
        match self.peek() {
            Some(0x30) => self.at += 1,
            point if digit(point) => {
                while digit(self.peek()) {
                    self.at += 1;
                }
            }
            _ => return None,
        }
        if self.peek() == Some(u32::from('.')) {
            self.at += 1;
            if !digit(self.peek()) {
                return None;
            }
            while digit(self.peek()) {
                self.at += 1;
            }
        }
        if matches!(self.peek(), Some(0x65 | 0x45)) {
            self.at += 1;
            if matches!(self.peek(), Some(0x2B | 0x2D)) {
                self.at += 1;
            }
            if !digit(self.peek()) {
                return None;
            }
            while digit(self.peek()) {
                self.at += 1;
            }
        }
        Some(
            self.text[start..self.at]
                .iter()
                .map(|point| char::from_u32(*point).expect("ASCII"))
                .collect(),
        )
    }

    fn hex4(&mut self) -> Option<u16> {
        let mut value = 0u16;
        for _ in 0..4 {
            let digit = char::from_u32(self.peek()?)?.to_digit(16)?;
            value = value * 16 + digit as u16;
            self.at += 1;
        }
        Some(value)
    }

    /// A string token at `self.at`: its code units.
    fn string(&mut self) -> Option<Vec<u16>> {
        self.at += 1;
        let mut units = Vec::new();
        loop {
            let point = self.peek()?;
            self.at += 1;
            match point {
                0x22 => break,
                0x00..=0x1F => return None,
                0x5C => {
                    let escape = char::from_u32(self.peek()?)?;
                    self.at += 1;
                    match escape {
                        '"' | '\\' | '/' => units.push(escape as u16),
                        'b' => units.push(0x08),
                        'f' => units.push(0x0C),
                        'n' => units.push(0x0A),
                        'r' => units.push(0x0D),
                        't' => units.push(0x09),
                        'u' => units.push(self.hex4()?),
                        _ => return None,
                    }
                }
                0xD800..=0xDFFF => units.push(point as u16),
                _ => {
                    let character = char::from_u32(point)?;
                    let mut buffer = [0u16; 2];
                    units.extend_from_slice(character.encode_utf16(&mut buffer));
                }
            }
        }
        if !self.dialect.lone_surrogates && String::from_utf16(&units).is_err() {
            return None;
        }
        Some(units)
    }
}

/// The collision key of an id value by the crate's documented equivalence
/// ("Equivalence" in the id module docs, restated here): a string's text
/// (`None` if it is not valid Unicode); a number's exact value, an integer
/// as its decimal text (so `1`, `1.0`, `1e0` and `"1"` collide), any other
/// value as `<digits>e<exponent>`; `None` for numbers servers read
/// differently (integers beyond ±(2^53−1), fractions of more than 15
/// significant digits, exponents beyond ±300 or written with more than six
/// digits, `NaN`, `Infinity`) and for anything else.
pub fn key(value: &Value) -> Option<String> {
    match value {
        Value::String(units) => String::from_utf16(units).ok(),
        Value::Number(text) => number_key(text),
        _ => None,
    }
}

/// The key of a JSON number's text (see [`key`]).
pub fn number_key(text: &str) -> Option<String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
        None => (unsigned, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let grammatical = !int.is_empty()
        && int.bytes().all(|byte| byte.is_ascii_digit())
        && (int == "0" || !int.starts_with('0'))
        && frac.bytes().all(|byte| byte.is_ascii_digit())
        && !(mantissa.contains('.') && frac.is_empty());
    if !grammatical {
        return None;
    }
    let exponent: i64 = match exponent {
        None => 0,
        Some(written) => {
            let digits = written.trim_start_matches(['+', '-']);
            if digits.is_empty()
                || digits.len() > 6
                || written.len() - digits.len() > 1
                || !digits.bytes().all(|byte| byte.is_ascii_digit())
            {
                return None;
            }
            let magnitude: i64 = digits.parse().ok()?;
            if written.starts_with('-') {
                -magnitude
            } else {
                magnitude
            }
        }
    };
    let all: String = format!("{int}{frac}");
    let significant = all.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some("0".to_owned());
    }
    let exponent = exponent - frac.len() as i64 + (significant.len() - trimmed.len()) as i64;
    let sign = if negative { "-" } else { "" };
    if exponent >= 0 {
        if trimmed.len() as i64 + exponent > 16 {
            return None;
        }
        let magnitude: u64 = format!("{trimmed}{}", "0".repeat(exponent as usize))
            .parse()
            .ok()?;
        if magnitude > (1 << 53) - 1 {
            return None;
        }
        return Some(format!("{sign}{magnitude}"));
    }
    if trimmed.len() > 15 || !(-300..=300).contains(&exponent) {
        return None;
    }
    Some(format!("{sign}{trimmed}e{exponent}"))
}

/// `body` as a gzip member of stored (uncompressed) deflate blocks: what a
/// client sends with `Content-Encoding: gzip`, without a compressor.
pub fn gzip_stored(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF];
    deflate_stored(&mut out, body);
    out.extend_from_slice(&crc32(body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out
}

/// `body` as a zlib stream of stored blocks (`Content-Encoding: deflate`).
pub fn zlib_stored(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    deflate_stored(&mut out, body);
    out.extend_from_slice(&adler32(body).to_be_bytes());
    out
}

fn deflate_stored(out: &mut Vec<u8>, body: &[u8]) {
    let mut blocks = body.chunks(0xFFFF).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xFF, 0xFF]);
    }
    while let Some(block) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let length = block.len() as u16;
        out.extend_from_slice(&length.to_le_bytes());
        out.extend_from_slice(&(!length).to_le_bytes());
        out.extend_from_slice(block);
    }
}

/// The body a server that inflates request bodies reads under this
/// `Content-Encoding`; only stored deflate blocks are decoded (what the
/// generators write), anything else is `None`: not judged.
pub fn inflate(coding: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    let coding = std::str::from_utf8(coding)
        .ok()?
        .trim()
        .to_ascii_lowercase();
    let (stream, trailer) = match coding.as_str() {
        "gzip" | "x-gzip" => {
            let rest = body.strip_prefix(&[0x1F, 0x8B, 8, 0][..])?;
            (rest.get(6..)?, 8)
        }
        "deflate" => (body.strip_prefix(&[0x78, 0x01][..])?, 4),
        _ => return None,
    };
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let header = *stream.get(at)?;
        if header & 0b110 != 0 {
            return None;
        }
        let length = u16::from_le_bytes([*stream.get(at + 1)?, *stream.get(at + 2)?]);
        let check = u16::from_le_bytes([*stream.get(at + 3)?, *stream.get(at + 4)?]);
        if check != !length {
            return None;
        }
        let start = at + 5;
        out.extend_from_slice(stream.get(start..start + usize::from(length))?);
        at = start + usize::from(length);
        if header & 1 == 1 {
            break;
        }
    }
    (stream.len() == at + trailer).then_some(out)
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for byte in bytes {
        a = (a + u32::from(*byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for one in ["1", "1.0", "1e0", "10e-1", "0.1e1", "1E+0", "100e-2"] {
            assert_eq!(number_key(one).as_deref(), Some("1"), "{one}");
        }
        assert_eq!(number_key("-0.0").as_deref(), Some("0"));
        assert_eq!(number_key("1.5"), number_key("15e-1"));
        assert_eq!(number_key("9007199254740992"), None);
        assert_eq!(number_key("1.0000000000000001"), None);
        assert_eq!(number_key("01"), None);
    }

    fn ids(body: &[u8], dialect: Dialect) -> Option<Vec<Option<String>>> {
        let reading = read(body, dialect)?;
        Some(reading.request_ids().map(key).collect())
    }

    #[test]
    fn repeated_keys_split_the_readings() {
        let body = br#"{"id":1,"method":"m","id":2}"#;
        assert_eq!(ids(body, LAST_WINS), Some(vec![Some("2".into())]));
        assert_eq!(ids(body, FIRST_WINS), Some(vec![Some("1".into())]));
        assert_eq!(ids(body, STRICT), None);
        // A key spelled with an escape is the same key.
        let escaped = br#"{"id":null,"method":"m","\u0069d":3}"#;
        assert_eq!(ids(escaped, LAST_WINS), Some(vec![Some("3".into())]));
        assert_eq!(ids(escaped, FIRST_WINS), Some(vec![]));
    }

    #[test]
    fn lenient_readers_take_what_serde_refuses() {
        let request = r#"{"id":1.0,"method":"tools\/call","params":{"x":NaN}}"#;
        assert_eq!(
            ids(request.as_bytes(), LAST_WINS),
            Some(vec![Some("1".into())])
        );
        assert_eq!(ids(request.as_bytes(), STRICT), None, "NaN");
        let plain = r#"{"id":1e0,"method":"m"}"#;
        let bom = [b"\xEF\xBB\xBF", plain.as_bytes()].concat();
        assert_eq!(ids(&bom, LAST_WINS), Some(vec![Some("1".into())]));
        assert_eq!(ids(&bom, JAVASCRIPT), Some(vec![Some("1".into())]));
        assert_eq!(ids(&bom, STRICT), None);
        let twice = [b"\xEF\xBB\xBF", &bom[..]].concat();
        assert_eq!(ids(&twice, LAST_WINS), None, "one mark is skipped, not two");
        assert_eq!(
            ids(&twice, JAVASCRIPT),
            Some(vec![Some("1".into())]),
            "Node 20's Request.json() skips two"
        );
        for (coding, compressed) in [("gzip", gzip_stored(&bom)), ("deflate", zlib_stored(&bom))] {
            assert_eq!(
                inflate(coding.as_bytes(), &compressed).as_deref(),
                Some(&bom[..])
            );
        }
        let utf16: Vec<u8> = plain.encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert_eq!(ids(&utf16, LAST_WINS), Some(vec![Some("1".into())]));
        assert_eq!(ids(&utf16, STRICT), None);
        let utf32: Vec<u8> = plain
            .chars()
            .flat_map(|c| u32::from(c).to_be_bytes())
            .collect();
        assert_eq!(ids(&utf32, FIRST_WINS), Some(vec![Some("1".into())]));
        // Python's `surrogatepass`: an encoded surrogate is a lone one.
        let raw = b"{\"id\":\"\xED\xA0\x80\",\"method\":\"m\"}";
        assert_eq!(ids(raw, LAST_WINS), Some(vec![None]));
        assert_eq!(ids(raw, STRICT), None);
        assert_eq!(
            ids(br#"{"id":"\ud800","method":"m"}"#, LAST_WINS),
            Some(vec![None])
        );
    }
}
