//! Restoring client ids in JSON-RPC responses, as a stream: the one
//! restorer behind both `application/json` bodies and the data of SSE events
//! ([`crate::wire::sse`]).
//!
//! Bytes go on as they arrive. The only ones held back are a message's
//! top-level `id` token and what follows it until the message shows whether
//! it is a response (a `result` or `error` key) or not (a `method` whose
//! value is a string: another makes no request, as the envelope reader
//! reads it; keys are read by their decoded text, as it reads them), and
//! then until its end, as a second `id` key (parsers keep the first, the
//! last, or refuse the message) or a string `method` still makes it pass as
//! the server wrote it: at most the id plus a bounded window, whatever the size
//! of the message or where its `id` sits (first in rmcp's and Python's
//! responses, last in the TypeScript SDK's). Past the window a response goes
//! on restored (a large result is the usual case; a second `id` that far
//! after the first is not caught), a message not yet known as a response
//! goes on as it is. A single message stops being read once its id is
//! settled; a batch is read to its end.

use std::collections::VecDeque;

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::wire::id::IdKey;
use crate::wire::id::{key_of, restore, IdMinter, Restored, RESERVED_PREFIX};
use crate::wire::scan::{Found, KeyName, Scanner, Sink};
use held::{Held, Kept, WINDOW};

mod held;

/// A response that passed to the client: the collision key of the client id
/// it carried, and whether that id was restored from a server-side id (the
/// answer to a remapped request) or went to the server as it is.
pub(crate) type Delivered = (IdKey, bool);

/// The answers of one text: inline for the usual one (a single response),
/// which then costs no allocation.
type Answers = SmallVec<[Delivered; 1]>;

/// At least this many responses of one text are remembered as answered (more
/// when the request was a larger batch, see [`Restorer::answering_up_to`]): a
/// server could send a batch of millions. One not remembered only means its
/// id is kept abandoned when the exchange ends, the safe side.
const MAX_ANSWERING: usize = 4096;

/// A piece of a chunk, as the caller frames it; positions are absolute
/// offsets in the stream of raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// These raw bytes are JSON text of the current message.
    Json(std::ops::Range<usize>),
    /// A line break between two lines of the JSON text (SSE `data:` lines are
    /// joined with `\n`), at the end of the first line's text.
    Break(usize),
    /// The JSON text ends here (an SSE event's end, a body's end).
    End(usize),
}

/// The message being read.
#[derive(Debug, Default)]
struct Current {
    /// The last key read, whose value comes next.
    key: Option<KeyName>,
    /// A non-null `result` or `error` was read.
    answers: bool,
    /// A string `method` was read: not a response.
    method: bool,
    /// An `id` key was read.
    id_seen: bool,
    /// The last key read is a second `id`.
    second_id: bool,
    /// The id's fate is settled (restored, passed on, or not to be held).
    settled: bool,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Restorer {
    scanner: Scanner,
    /// The current text is a batch (the scanner read its `[`).
    batch: bool,
    current: Current,
    held: Option<Held>,
    /// The current text needs no more reading (a single message whose id is
    /// settled), or cannot be followed: its bytes pass until its end.
    passing: bool,
    /// Longest id token held back; a longer one goes on as written.
    max_id: usize,
    /// Learn the ids of every response, restored or not.
    watch: bool,
    /// Restore server-side ids (else only watch): only a response that may
    /// carry ids this guard issued for its request is restored.
    restoring: bool,
    /// Whose ids are restored: only those the minter issued for the session
    /// (else any well-formed one: the crate's own tests and fuzz targets).
    binding: Option<Binding>,
    /// Ids written like server-side ids that the binding did not issue.
    refused: usize,
    /// The most responses of one text remembered as answered.
    max_answering: usize,
    restored: usize,
    /// Responses of the current text, counted as answered once it ends (the
    /// client has the whole response then).
    answering: Answers,
    answered: Answers,
    /// Absolute offset of the first byte not yet emitted or held.
    emitted: usize,
}

/// The ids a response may have restored: those `minter` issued for the
/// session the response belongs to (by its digest: the session id itself
/// can be kilobytes long, and a clone of its header value would hold the
/// whole buffer it was read into for as long as the response is open).
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) minter: Arc<IdMinter>,
    pub(crate) session: u64,
}

impl Restorer {
    /// A restorer that holds the server-side ids that can carry a client id
    /// up to `max_id` bytes long (the longest a client could have sent), and
    /// client ids that long; `watch`: also learn the ids of responses that
    /// need no restoring ([`take_answered`](Self::take_answered)).
    pub(crate) fn new(max_id: usize, watch: bool) -> Self {
        Self {
            scanner: Scanner::default(),
            batch: false,
            current: Current::default(),
            held: None,
            passing: false,
            max_id: longest_server_id(max_id),
            watch,
            restoring: true,
            binding: None,
            refused: 0,
            max_answering: MAX_ANSWERING,
            restored: 0,
            answering: Answers::new(),
            answered: Answers::new(),
            emitted: 0,
        }
    }

    /// A restorer that only watches: it restores nothing.
    pub(crate) fn without_restoring(mut self) -> Self {
        self.restoring = false;
        self
    }

    /// A restorer that restores only the ids `binding` issued.
    pub(crate) fn bound(mut self, binding: Binding) -> Self {
        self.binding = Some(binding);
        self
    }

    /// How many server-side-looking ids were refused since the last call.
    pub(crate) fn take_refused(&mut self) -> usize {
        std::mem::take(&mut self.refused)
    }

    /// Remembers up to `requests` answers of one text (at least the default
    /// bound): the answer to each request of a batch that large frees its id.
    /// Bounded by what the client sent, not by what the server writes.
    pub(crate) fn answering_up_to(mut self, requests: usize) -> Self {
        self.max_answering = requests.max(MAX_ANSWERING);
        self
    }

    /// How many ids were restored since the last call.
    pub(crate) fn take_restored(&mut self) -> usize {
        std::mem::take(&mut self.restored)
    }

    /// The responses that passed since the last call (only when watching):
    /// the collision keys of their client ids, and whether each was restored.
    pub(crate) fn take_answered(&mut self) -> smallvec::Drain<'_, [Delivered; 1]> {
        self.answered.drain(..)
    }

    /// Takes the next raw chunk, which starts at absolute offset `base`, and
    /// the parts the caller found in it; appends what can go on to `out`.
    pub(crate) fn push(
        &mut self,
        chunk: &Bytes,
        base: usize,
        parts: &[Part],
        out: &mut VecDeque<Bytes>,
    ) {
        debug_assert_eq!(self.emitted, base, "chunks arrive in order");
        let at = Cursor { chunk, base };
        for part in parts {
            match part {
                Part::Json(range) => {
                    if !self.passing {
                        let text = &chunk[range.start - base..range.end - base];
                        self.read(text, range.start, &at, out);
                    }
                }
                Part::Break(position) => {
                    if !self.passing {
                        self.read(b"\n", *position, &at, out);
                    }
                }
                Part::End(position) => self.end(*position, &at, out),
            }
        }
        let end = base + chunk.len();
        let window_end = self
            .held
            .as_ref()
            .filter(|held| held.response)
            .and_then(Held::window_end);
        if let Some(window_end) = window_end.filter(|window_end| end > *window_end) {
            // A response whose window passed with no second `id`: restored,
            // and the rest of the chunk goes on uncopied.
            self.conclude(window_end.max(self.emitted), &at, out);
            self.emit(end, &at, out);
        } else if self.held.is_some() {
            self.absorb(end, &at);
            // Past these bounds `restore` would refuse anyway: let the bytes go.
            // By position: a restorer that only watches keeps only the id.
            let over = self.held.as_ref().is_some_and(|held| {
                let held_len = end - held.start;
                let id_len = held.id_len.unwrap_or(held_len);
                id_len > self.max_id || held_len - id_len > WINDOW
            });
            if over {
                self.release(None, end, &at, out);
            }
        } else {
            self.emit(end, &at, out);
        }
    }

    /// The stream ended: whatever is held goes on as it is.
    pub(crate) fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        // Only a restorer that restores holds what goes on.
        if let Some(Held {
            bytes: Kept::All(bytes),
            ..
        }) = self.held.take()
        {
            if !bytes.is_empty() {
                out.push_back(bytes.freeze());
            }
        }
    }

    /// Reads `text` (JSON text whose first byte sits at absolute `position`,
    /// or a virtual line break that maps there).
    fn read(&mut self, text: &[u8], position: usize, at: &Cursor<'_>, out: &mut VecDeque<Bytes>) {
        let place = Place {
            text,
            base: self.scanner.offset(),
            position,
        };
        // The scanner goes out while the restorer is its sink, and stops
        // as soon as the text needs no more reading (a single message
        // whose id is settled).
        let mut scanner = std::mem::take(&mut self.scanner);
        let read = scanner.feed_until_done(
            text,
            &mut Reading {
                restorer: self,
                place,
                at,
                out,
            },
        );
        self.scanner = scanner;
        if read.is_err() && !self.passing {
            // Not JSON the scanner can follow: nothing more is restored in
            // it.
            self.passing = true;
            if self.held.is_some() {
                self.release(None, position, at, out);
            }
        }
    }

    fn on_event(
        &mut self,
        event: &Found,
        place: &Place<'_>,
        at: &Cursor<'_>,
        out: &mut VecDeque<Bytes>,
    ) {
        match event {
            Found::MessageStart(_) => self.current = Current::default(),
            Found::Key { name, .. } => {
                self.current.key = Some(*name);
                self.current.second_id =
                    *name == KeyName::Id && std::mem::replace(&mut self.current.id_seen, true);
            }
            Found::ValueStart(offset) => {
                let first = place.byte(*offset);
                match self.current.key {
                    // A second `id` makes the message ambiguous (parsers keep
                    // the first, the last, or refuse it): nothing in it is
                    // restored. Decided at its value, as a `method` is: the
                    // one byte the event stands for is in the chunk being
                    // read, so where chunks end decides nothing.
                    Some(KeyName::Id) if self.current.second_id => {
                        self.not_a_response(place.of(*offset), at, out);
                    }
                    // Only a string `method` makes a request or a
                    // notification, as the envelope reader classifies
                    // messages (Python's SDK reads the others as responses;
                    // the TypeScript SDK drops them): decided at the value's
                    // first byte, where its kind shows.
                    Some(KeyName::Method) if first == Some(b'"') => {
                        self.current.method = true;
                        self.not_a_response(place.of(*offset), at, out);
                    }
                    Some(KeyName::Id) if !self.current.method && !self.current.settled => {
                        // Only a string can be a server-side id; any id is
                        // held when responses are watched for.
                        if self.watch || first == Some(b'"') {
                            let start = place.of(*offset);
                            self.emit(start, at, out);
                            self.held = Some(Held {
                                start,
                                id_len: None,
                                response: false,
                                bytes: Kept::new(self.restoring),
                            });
                        } else {
                            self.settle();
                        }
                    }
                    Some(KeyName::Result | KeyName::Error) if first != Some(b'n') => {
                        // A null `result` or `error` answers nothing.
                        self.current.answers = true;
                        let id_ended = self.held.as_ref().is_some_and(|held| held.id_len.is_some());
                        if id_ended {
                            self.answer(place.of(*offset), at, out);
                        }
                    }
                    _ => {}
                }
            }
            Found::ValueEnd(offset) => {
                if self.current.key == Some(KeyName::Id) {
                    let end = place.of(*offset);
                    if let Some(held) = &mut self.held {
                        if held.id_len.is_none() {
                            held.id_len = Some(end - held.start);
                            if self.current.answers {
                                self.answer(end, at, out);
                            }
                        }
                    }
                }
                self.current.key = None;
            }
            Found::MessageEnd(offset) => {
                if self.held.as_ref().is_some_and(|held| held.response) {
                    self.conclude(place.of(*offset), at, out);
                } else if self.held.is_some() {
                    self.release(None, place.of(*offset), at, out);
                }
                self.settle();
            }
            Found::OtherElement => {}
        }
    }

    /// What was read at `position` (a second `id`, a `method`) shows the
    /// message is no response whose id is to be restored: a held id goes on
    /// as it is, unless its window had passed (then it went on restored,
    /// wherever the chunk ended), and the message needs nothing more.
    fn not_a_response(&mut self, position: usize, at: &Cursor<'_>, out: &mut VecDeque<Bytes>) {
        let past_window = self.held.as_ref().is_some_and(|held| {
            held.response && held.window_end().is_some_and(|end| position > end)
        });
        if past_window {
            self.conclude(position, at, out);
        } else if self.held.is_some() {
            self.release(None, position, at, out);
        }
        self.settle();
    }

    /// The current message's id needs nothing more; a single message then
    /// needs no more reading at all.
    fn settle(&mut self) {
        self.current.settled = true;
        if !self.batch {
            self.passing = true;
        }
    }

    /// The message is known as a response at `position`: its held id is
    /// kept until the message ends (or its window passes) if it is to be
    /// restored or watched, else it goes on as it is.
    fn answer(&mut self, position: usize, at: &Cursor<'_>, out: &mut VecDeque<Bytes>) {
        self.absorb(position, at);
        // Decided by positions, not by what happens to be held: how the
        // stream is chunked never changes what is restored.
        let id = self.held_id().filter(|_| {
            self.held.as_ref().is_some_and(|held| {
                held.window_end()
                    .is_some_and(|window_end| position <= window_end)
            })
        });
        let kept = id.is_some_and(|id| self.watch || restore(id).is_some());
        match &mut self.held {
            Some(held) if kept => held.response = true,
            _ => {
                self.release(None, position, at, out);
                self.settle();
            }
        }
    }

    /// The held id token, if it ended within the bounds.
    fn held_id(&self) -> Option<&str> {
        self.held.as_ref()?.id(self.max_id)
    }

    /// The held response goes on with its id restored (if it is a
    /// server-side id), with what followed it up to `position`.
    fn conclude(&mut self, position: usize, at: &Cursor<'_>, out: &mut VecDeque<Bytes>) {
        self.absorb(position, at);
        // Read in place: the held id is not copied again to be looked at.
        let held = self.held.take();
        let id = held.as_ref().and_then(|held| held.id(self.max_id));
        // A foreign id is counted even where nothing is restored: it is the
        // sign of an upstream that mixes sessions up.
        let verdict = id.map(|id| match &self.binding {
            None => restore(id).map_or(Restored::Not, Restored::Original),
            Some(binding) => binding.minter.restore_in(binding.session, id),
        });
        let original = match verdict {
            Some(Restored::Original(original)) if self.restoring => Some(original),
            Some(Restored::Foreign) => {
                self.refused += 1;
                None
            }
            _ => None,
        };
        if self.watch && self.answering.len() < self.max_answering {
            // Only an id with a collision key can answer a request: the
            // request path refuses every other. A `null` id (a server's
            // parse error) keyed by its text would free a client's `"null"`.
            let key = id.and_then(|id| key_of(original.as_deref().unwrap_or(id)));
            if let Some(key) = key {
                self.answering
                    .push((IdKey::from(&*key), original.is_some()));
            }
        }
        self.held = held;
        if original.is_some() {
            self.restored += 1;
        }
        self.release(original, position, at, out);
        self.settle();
    }

    /// Lets the held bytes go, up to `position`, with the id replaced by
    /// `original` if given.
    fn release(
        &mut self,
        original: Option<String>,
        position: usize,
        at: &Cursor<'_>,
        out: &mut VecDeque<Bytes>,
    ) {
        self.absorb(position, at);
        let Some(held) = self.held.take() else {
            return;
        };
        self.current.settled = true;
        let Kept::All(mut bytes) = held.bytes else {
            // Only watched: nothing is handed on (see `absorb`).
            return;
        };
        match (original, held.id_len) {
            (Some(original), Some(id_len)) => {
                out.push_back(Bytes::from(original));
                let rest = bytes.split_off(id_len);
                if !rest.is_empty() {
                    out.push_back(rest.freeze());
                }
            }
            _ => {
                if !bytes.is_empty() {
                    out.push_back(bytes.freeze());
                }
            }
        }
    }

    /// The current text ends at `position`: a scalar being read ends, a
    /// message left open goes on as it is, and the next text starts afresh.
    fn end(&mut self, position: usize, at: &Cursor<'_>, out: &mut VecDeque<Bytes>) {
        if !self.passing {
            // Whatever the scanner still reports sits at the text's end.
            let place = Place {
                text: b"",
                base: self.scanner.offset(),
                position,
            };
            let mut scanner = std::mem::take(&mut self.scanner);
            // An incomplete text only means nothing more to restore in it.
            let _ = scanner.finish(&mut Reading {
                restorer: self,
                place,
                at,
                out,
            });
        }
        if self.held.is_some() {
            self.release(None, position, at, out);
        }
        if self.answered.is_empty() {
            // The usual case (one text per exchange): no second vector.
            std::mem::swap(&mut self.answered, &mut self.answering);
        } else {
            self.answered.append(&mut self.answering);
        }
        self.scanner = Scanner::default();
        self.batch = false;
        self.current = Current::default();
        self.passing = false;
    }

    /// Moves the chunk's bytes before `position` into the held bytes.
    fn absorb(&mut self, position: usize, at: &Cursor<'_>) {
        let Some(held) = &mut self.held else {
            return;
        };
        if position <= self.emitted {
            return;
        }
        // A restorer that only watches hands nothing on (its caller sends the
        // chunks as they came), so of the held bytes it keeps only the id,
        // the one thing it reads again.
        let kept = match held.id_len {
            Some(id_len) if !self.restoring => position.min(held.start + id_len),
            _ => position,
        };
        if kept > self.emitted {
            held.bytes
                .extend_from_slice(&at.chunk[self.emitted - at.base..kept - at.base]);
        }
        self.emitted = position;
    }

    /// Emits the chunk's bytes before `position`, without copying.
    fn emit(&mut self, position: usize, at: &Cursor<'_>, out: &mut VecDeque<Bytes>) {
        if position <= self.emitted {
            return;
        }
        if self.restoring {
            out.push_back(at.chunk.slice(self.emitted - at.base..position - at.base));
        }
        self.emitted = position;
    }
}

/// The longest server-side id token carrying a client id of `original`
/// bytes: the quotes, the prefix, a 16-digit tag, a serial of at most 20
/// digits, two colons, and the original escaped (six bytes at most for one:
/// a raw tab or line break inside a non-scalar id becomes `\u0009`). The
/// client id itself can be as long as the body, so bounding the held token by
/// it alone would leave a remapped long id unrestored.
fn longest_server_id(original: usize) -> usize {
    original
        .saturating_mul(6)
        .saturating_add(2 + RESERVED_PREFIX.len() + 16 + 20 + 2)
}

/// The chunk being pushed and where it starts in the stream.
struct Cursor<'a> {
    chunk: &'a Bytes,
    base: usize,
}

/// Where a piece of text being read sits: the scanner's offsets in it map
/// to absolute positions in the stream.
struct Place<'a> {
    text: &'a [u8],
    /// The scanner's offset of the text's first byte.
    base: usize,
    /// The absolute position of the text's first byte (or of the virtual
    /// line break it stands for).
    position: usize,
}

impl Place<'_> {
    /// The absolute position of the scanner's `offset`.
    fn of(&self, offset: usize) -> usize {
        self.position + offset.saturating_sub(self.base).min(self.text.len())
    }

    /// The byte at the scanner's `offset`, if it is in this text.
    fn byte(&self, offset: usize) -> Option<u8> {
        self.text.get(offset.checked_sub(self.base)?).copied()
    }
}

/// The restorer as the scanner's sink while it reads one piece of text:
/// each event is acted on as it is found, and reading stops once the text
/// needs no more.
struct Reading<'r, 'a> {
    restorer: &'r mut Restorer,
    place: Place<'a>,
    at: &'r Cursor<'a>,
    out: &'r mut VecDeque<Bytes>,
}

impl Sink for Reading<'_, '_> {
    fn event(&mut self, event: Found) {
        // A text that needs no more reading takes no more events (the
        // scanner's end may still report some).
        if !self.restorer.passing {
            self.restorer
                .on_event(&event, &self.place, self.at, self.out);
        }
    }

    fn batch(&mut self) {
        self.restorer.batch = true;
    }

    fn done(&self) -> bool {
        self.restorer.passing
    }
}

/// Restores the client ids in one whole JSON body (single or batch):
/// `None` when there is nothing to restore. For the crate's benchmarks,
/// fuzz checks and tests.
#[cfg(any(test, feature = "internals"))]
pub(crate) fn restore_whole(body: &[u8]) -> Option<Vec<u8>> {
    let chunk = Bytes::copy_from_slice(body);
    let mut restorer = Restorer::new(usize::MAX, false);
    let mut out = VecDeque::new();
    let parts = [Part::Json(0..body.len()), Part::End(body.len())];
    restorer.push(&chunk, 0, &parts, &mut out);
    restorer.finish(&mut out);
    if restorer.take_restored() == 0 {
        return None;
    }
    Some(out.iter().flat_map(|piece| piece.iter().copied()).collect())
}

#[cfg(test)]
mod tests;
