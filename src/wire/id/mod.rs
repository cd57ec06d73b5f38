//! Request ids: when two ids collide, and the self-describing server-side ids
//! that remapping forwards instead.
//!
//! # Equivalence
//! Two ids collide when some server the guard fronts would route them to one
//! slot. The key of a string id is its decoded text (`"\u0031"` is `1`). A
//! number is keyed by its value however it is written: rmcp reads `1.0`,
//! `1e0` and `10e-1` as the integer 1, and TypeScript ids are JavaScript
//! numbers. An integer value's key is its decimal text (`-0` is `0`), so it
//! also collides with the string of the same digits: the Python SDK routes by
//! `str(id)`, so `1` and `"1"` share one routing slot there.
//!
//! Ids that servers do not read alike have no key, and the request path
//! refuses them: strings that are not valid Unicode (lone surrogates, which
//! Python and JavaScript keep and serde refuses), integers beyond ±(2^53 − 1)
//! (JavaScript merges neighbours there), fractions with more than 15
//! significant digits or extreme exponents, and anything that is not a string
//! or a number.
//!
//! # Remapped ids
//! A remapped id is a JSON string `"mcp-id-guard:<mac>:<counter>:<original>"`
//! where `<original>` is the client's id exactly as it was written,
//! `<counter>` makes it unique within the layer (it starts at a random point,
//! so ids from several guard replicas in front of one server do not collide),
//! and `<mac>` is a keyed MAC (SipHash-2-4, 64 bits, hex) over the session the
//! id was issued in, the counter and the original. Restoring needs no lookup
//! table and gives back the original bytes, but only for an id this layer's
//! secret issued for the session the response belongs to: an id of another
//! session, or one nobody issued, passes as the server wrote it (replicas
//! that share [`IdGuardLayer::with_secret`](crate::IdGuardLayer::with_secret)
//! restore each other's ids). An upstream that leaks another session's
//! answer is not dressed up as a correct one.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::value::RawValue;
use smallvec::SmallVec;

/// The reserved prefix of server-side ids. Client ids that start with it are
/// always rewritten, so restoring unwraps exactly one level.
pub(crate) const RESERVED_PREFIX: &str = "mcp-id-guard:";

/// The collision key of an id, as UTF-8 bytes; see the module docs for the
/// equivalence. Kept inline up to [`INLINE_ID_KEY`] bytes: the response path
/// makes one for every answer it sees, and most ids are short integers, so
/// the usual answer costs no allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdKey(SmallVec<[u8; INLINE_ID_KEY]>);

/// The JSON text of a server-side id, as [`IdMinter::mint_in`] writes it.
pub(crate) type ServerIdText = SmallVec<[u8; INLINE_SERVER_ID]>;

/// The longest server-side id written without an allocation of its own: the
/// quotes, the prefix, the tag, a serial of up to 20 digits, two colons and a
/// client id of up to 43 bytes.
pub(crate) const INLINE_SERVER_ID: usize = 96;

/// The longest collision key kept without an allocation: every integer id
/// every server reads exactly (at most 16 digits and a sign), and short
/// string ids.
pub(crate) const INLINE_ID_KEY: usize = 24;

impl IdKey {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for IdKey {
    fn from(key: &str) -> Self {
        Self(SmallVec::from_slice(key.as_bytes()))
    }
}

/// Computes the collision key of an id's JSON text (the tests' and the fuzz
/// targets' way in; the guard computes keys as it reads).
#[cfg(any(test, feature = "internals"))]
pub(crate) fn id_key(raw: &str) -> IdKey {
    IdKey::from(&*id_key_text(raw))
}

/// The collision key of an id's JSON text, borrowed from it whenever it can
/// be (the key of `7` is `7`, of `"abc"` is `abc`): the session table looks
/// up every request's id, and most of them are never stored. An id that
/// [`key_of`] refuses is keyed by its exact text (the request path never
/// hands one to the table; the response path only compares).
pub(crate) fn id_key_text(raw: &str) -> Cow<'_, str> {
    key_of(raw).unwrap_or(Cow::Borrowed(raw))
}

/// The largest integer every server reads exactly: ids are JavaScript numbers
/// in the TypeScript SDK, so `9007199254740993` and `9007199254740992` are one
/// id there and two in Python and rmcp.
const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

/// A fraction keeps its identity across servers only up to this many
/// significant digits (an f64 holds 15 decimal digits exactly).
const MAX_FRACTION_DIGITS: usize = 15;

/// The collision key of an id's JSON text (see the module docs), or `None`
/// for an id that servers do not read alike: a string that is not valid
/// Unicode, a number outside what every server reads exactly, or anything
/// else (`true`, an object, `NaN`, ...).
pub(crate) fn key_of(raw: &str) -> Option<Cow<'_, str>> {
    match raw.as_bytes().first()? {
        // A string written without escapes is its own text: no decoding,
        // no allocation (see `string_text` in the envelope reader).
        b'"' if crate::wire::scan::plain_string(raw.as_bytes()).is_some() => {
            Some(Cow::Borrowed(&raw[1..raw.len() - 1]))
        }
        b'"' => serde_json::from_str::<Cow<'_, str>>(raw).ok(),
        b'-' | b'0'..=b'9' => number_key(raw),
        _ => None,
    }
}

/// The key of a JSON number: its exact value, written one way. An integer
/// value (`1`, `1.0`, `1e0`, `10e-1`, `-0.0`) is its decimal text, so it
/// collides with the string of the same digits; any other value is
/// `<digits>e<exponent>` with no leading or trailing zeros in the digits.
fn number_key(raw: &str) -> Option<Cow<'_, str>> {
    // Most ids are small plain integers, already written the one way: their
    // key is their text, with no digits to collect.
    if is_plain_integer(raw.as_bytes()) {
        return Some(Cow::Borrowed(raw));
    }
    number_value_key(raw)
}

/// Whether an id's JSON text is an integer written the one way its key is
/// (no leading zero, no `-0`) with at most 15 digits: its own key, so
/// [`key_of`] accepts it.
pub(crate) fn is_plain_integer(raw: &[u8]) -> bool {
    let digits = raw.strip_prefix(b"-").unwrap_or(raw);
    !digits.is_empty()
        && digits.len() <= MAX_FRACTION_DIGITS
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || raw == b"0")
}

/// [`number_key`] for any spelling of a number.
fn number_value_key(raw: &str) -> Option<Cow<'_, str>> {
    let bytes = raw.as_bytes();
    let (negative, rest) = match bytes.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, bytes),
    };
    // The JSON grammar: int [frac] [exp], int without leading zeros.
    let int_len = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
    if int_len == 0 || (int_len > 1 && rest[0] == b'0') {
        return None;
    }
    let (int, mut rest) = rest.split_at(int_len);
    let mut frac: &[u8] = &[];
    if let Some((b'.', after)) = rest.split_first() {
        let len = after
            .iter()
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if len == 0 {
            return None;
        }
        (frac, rest) = after.split_at(len);
    }
    let mut exponent: i64 = 0;
    if let Some((b'e' | b'E', after)) = rest.split_first() {
        let (sign, digits) = match after.split_first() {
            Some((b'-', digits)) => (-1, digits),
            Some((b'+', digits)) => (1, digits),
            _ => (1, after),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Past a few digits the value is out of every range we accept.
        if digits.len() > 6 {
            return None;
        }
        let value: i64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        exponent = sign * value;
        rest = &[];
    }
    if !rest.is_empty() {
        return None;
    }
    // value = digits × 10^exponent, digits without leading or trailing zeros.
    let all = || int.iter().chain(frac).copied();
    let leading = all().take_while(|digit| *digit == b'0').count();
    let digits: Vec<u8> = all().skip(leading).collect();
    let trailing = digits
        .iter()
        .rev()
        .take_while(|digit| **digit == b'0')
        .count();
    let digits = &digits[..digits.len() - trailing];
    if digits.is_empty() {
        return Some(Cow::Borrowed("0"));
    }
    exponent += trailing as i64 - frac.len() as i64;
    let sign = if negative { "-" } else { "" };
    if exponent >= 0 {
        // An integer: at most 16 digits, at most 2^53 - 1.
        if digits.len() as i64 + exponent > 16 {
            return None;
        }
        let mut text = String::with_capacity(17);
        text.push_str(sign);
        text.push_str(std::str::from_utf8(digits).ok()?);
        text.extend(std::iter::repeat_n('0', exponent as usize));
        let magnitude: u64 = text.trim_start_matches('-').parse().ok()?;
        if magnitude > MAX_EXACT_INTEGER {
            return None;
        }
        return Some(if text == raw {
            Cow::Borrowed(raw)
        } else {
            Cow::Owned(text)
        });
    }
    if digits.len() > MAX_FRACTION_DIGITS || !(-300..=300).contains(&exponent) {
        return None;
    }
    Some(Cow::Owned(format!(
        "{sign}{}e{exponent}",
        std::str::from_utf8(digits).ok()?
    )))
}

/// Whether an id key is in the reserved namespace (a forged or replayed
/// server-side id coming from a client).
pub(crate) fn is_reserved(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

/// Mints server-side ids for one layer instance, and restores the ones its
/// secret issued.
pub(crate) struct IdMinter {
    /// SipHash-2-4's two key words.
    key: (u64, u64),
    counter: AtomicU64,
}

impl std::fmt::Debug for IdMinter {
    // The secret stays out of debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdMinter").finish_non_exhaustive()
    }
}

/// What restoring a server-side id gives.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Restored {
    /// Not a server-side id: it goes on as it is.
    Not,
    /// Issued by this secret for this session: the client's original id.
    Original(String),
    /// Written like a server-side id but not issued by this secret for this
    /// session: it goes on as it is, and is counted.
    Foreign,
}

/// 64 random bits from the OS-seeded `RandomState`, mixed with the time and
/// the process id (processes started from one image separate).
pub(crate) fn random_word(salt: u64) -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(salt);
    hasher.write_u32(std::process::id());
    if let Ok(since_epoch) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since_epoch.as_nanos());
    }
    hasher.finish()
}

impl IdMinter {
    /// A minter with a random secret of its own.
    pub(crate) fn new() -> Self {
        let secret = (random_word(1), random_word(2));
        let mut minter = Self::with_key(secret);
        // A random start keeps replicas sharing a secret apart.
        minter.counter = AtomicU64::new(random_word(3) >> 2);
        minter
    }

    /// A minter whose ids replicas with the same secret restore.
    pub(crate) fn with_secret(secret: [u8; 16]) -> Self {
        let (low, high) = secret.split_at(8);
        let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().unwrap_or_default());
        let mut minter = Self::with_key((word(low), word(high)));
        minter.counter = AtomicU64::new(random_word(3) >> 2);
        minter
    }

    fn with_key(key: (u64, u64)) -> Self {
        Self {
            key,
            counter: AtomicU64::new(0),
        }
    }

    fn hasher(&self) -> siphasher::sip::SipHasher24 {
        siphasher::sip::SipHasher24::new_with_keys(self.key.0, self.key.1)
    }

    /// The keyed digest of a session id that server-side ids are bound to:
    /// what a response keeps to check its ids, instead of the session id
    /// itself (which can be kilobytes long).
    pub(crate) fn session_digest(&self, session: &[u8]) -> u64 {
        let mut hasher = self.hasher();
        hasher.write(session);
        hasher.finish()
    }

    /// The MAC of an id issued in the session of `digest` with `serial` for
    /// `original` (length-prefixed, so no two inputs read alike).
    fn mac(&self, digest: u64, serial: &[u8], original: &[u8]) -> u64 {
        let mut hasher = self.hasher();
        hasher.write_u64(digest);
        for part in [serial, original] {
            hasher.write_u64(part.len() as u64);
            hasher.write(part);
        }
        hasher.finish()
    }

    /// The JSON text of a fresh server-side id for a request of `session`
    /// carrying `original` (the client's id JSON text) inside it.
    ///
    /// Written straight into one buffer, inline up to [`INLINE_SERVER_ID`]
    /// bytes: the table keeps it behind one `Arc`, so the usual id costs
    /// that allocation and no other (`to_string` and `format!` for the serial
    /// and the tag were two more, and a tenth of a remapped request's
    /// instructions).
    pub(crate) fn mint_in(&self, session: &[u8], original: &str) -> ServerIdText {
        let mut digits = itoa::Buffer::new();
        let serial = digits
            .format(self.counter.fetch_add(1, Ordering::Relaxed))
            .as_bytes();
        let digest = self.session_digest(session);
        let mac = self.mac(digest, serial, original.as_bytes());
        let mut out = ServerIdText::new();
        out.push(b'"');
        out.extend_from_slice(RESERVED_PREFIX.as_bytes());
        out.extend_from_slice(&hex16(mac));
        out.push(b':');
        out.extend_from_slice(serial);
        out.push(b':');
        escape_into(&mut out, original);
        out.push(b'"');
        out
    }

    /// A server-side id for the empty session (the unit tests', the
    /// benchmarks' and the fuzz targets' minter).
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn mint(&self, original: &str) -> Vec<u8> {
        self.mint_in(b"", original).to_vec()
    }

    /// Restores `raw` (an id's JSON text) in a response of the session whose
    /// [`session_digest`](Self::session_digest) is `digest`: only an id this
    /// secret issued for that session gives back its original.
    pub(crate) fn restore_in(&self, digest: u64, raw: &str) -> Restored {
        let Some(parts) = parse(raw) else {
            return Restored::Not;
        };
        let mac = self.mac(digest, parts.serial.as_bytes(), parts.original.as_bytes());
        // Compared as whole words; a timing difference tells nothing an
        // attacker can use without the key to compute candidate tags.
        if mac == parts.mac {
            Restored::Original(parts.original.into_owned())
        } else {
            Restored::Foreign
        }
    }
}

/// Appends `text` as the inside of a JSON string literal.
fn escape_into(out: &mut ServerIdText, text: &str) {
    for &byte in text.as_bytes() {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            // Whitespace inside a non-scalar id's JSON text (newlines, tabs).
            0x00..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.extend_from_slice(&hex16(u64::from(byte))[14..]);
            }
            _ => out.push(byte),
        }
    }
}

/// `word` as 16 lowercase hex digits: the tag of a server-side id, written
/// without the formatting machinery (which cost ~400 instructions a tag).
fn hex16(word: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0; 16];
    for (at, digit) in text.iter_mut().enumerate() {
        *digit = DIGITS[((word >> (60 - 4 * at)) & 0xf) as usize];
    }
    text
}

/// The parts of a well-formed server-side id, borrowed from its JSON text
/// when that is written without escapes (an integer client id, the usual
/// case): restoring then copies only the original, once, into the response.
pub(crate) struct Parts<'a> {
    mac: u64,
    /// The counter's decimal digits.
    pub(crate) serial: Cow<'a, str>,
    /// The client's id JSON text.
    pub(crate) original: Cow<'a, str>,
}

/// If `raw` (an id's JSON text) is written like a server-side id, returns
/// the client's original id JSON text carried inside it, whoever issued it
/// (the unbound restorer of the crate's own tests, benchmarks and fuzz
/// targets; responses are restored by [`IdMinter::restore_in`]).
///
/// Only ids written the way guards write them, with the prefix spelled out
/// literally, are restored: servers echo ids as they received them, and this
/// keeps the SSE rewriter's fast path (a search for the literal prefix) exact,
/// so its output never depends on how the stream was chunked.
pub(crate) fn restore(raw: &str) -> Option<String> {
    parse(raw).map(|parts| parts.original.into_owned())
}

/// The parts of `raw` (an id's JSON text) if it is written like a
/// server-side id; the MAC is read, not checked.
pub(crate) fn parse(raw: &str) -> Option<Parts<'_>> {
    if !raw
        .strip_prefix('"')
        .is_some_and(|inside| inside.starts_with(RESERVED_PREFIX))
    {
        return None;
    }
    // A string without escapes is its own text (see `key_of`): serde_json
    // decodes only the others.
    let decoded = match crate::wire::scan::plain_string(raw.as_bytes()) {
        Some(_) => Cow::Borrowed(&raw[1..raw.len() - 1]),
        None => serde_json::from_str::<Cow<'_, str>>(raw).ok()?,
    };
    let (mac, serial, original) = split(&decoded)?;
    let (serial, original) = match &decoded {
        Cow::Borrowed(text) => (Cow::Borrowed(&text[serial]), Cow::Borrowed(&text[original])),
        Cow::Owned(text) => (
            Cow::Owned(text[serial].to_owned()),
            Cow::Owned(text[original].to_owned()),
        ),
    };
    Some(Parts {
        mac,
        serial,
        original,
    })
}

/// The tag's value and where the serial and the original lie in a decoded
/// server-side id, if it is well formed.
fn split(decoded: &str) -> Option<(u64, Range<usize>, Range<usize>)> {
    let rest = decoded.strip_prefix(RESERVED_PREFIX)?;
    let (tag, rest) = rest.split_once(':')?;
    let (serial, original) = rest.split_once(':')?;
    let well_formed = tag.len() == 16
        && tag.bytes().all(|byte| byte.is_ascii_hexdigit())
        && !serial.is_empty()
        && serial.bytes().all(|byte| byte.is_ascii_digit());
    if !well_formed {
        return None;
    }
    // Only give back something that is itself one whole JSON value, and that
    // fits in an SSE data line (guards mint no line breaks: ids are strings
    // or numbers). A plain integer is one; anything else serde_json reads.
    if original.contains(['\r', '\n']) {
        return None;
    }
    if !is_plain_integer(original.as_bytes()) {
        let value = serde_json::from_str::<&RawValue>(original).ok()?;
        if value.get().len() != original.len() {
            return None;
        }
    }
    let serial_start = RESERVED_PREFIX.len() + tag.len() + 1;
    let original_start = serial_start + serial.len() + 1;
    Some((
        u64::from_str_radix(tag, 16).ok()?,
        serial_start..serial_start + serial.len(),
        original_start..decoded.len(),
    ))
}

#[cfg(test)]
mod tests;
