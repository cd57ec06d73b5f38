//! Reading a response body for the guard: framing it as one JSON text or
//! an SSE stream, skipping a leading byte order mark, and handing what the
//! restorer finds (answers, restored and refused ids, the last event id) to
//! the registration or the table. [`super::body::ResponseBody`] drives it
//! frame by frame.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

use crate::table::{Registration, Resumed, Table};
use crate::wire::restore::Delivered;
use crate::wire::restore::{Binding, Part, Restorer};
use crate::wire::sse::Rewriter;

/// A body being read. What reading needs is made at its first chunk: an
/// exchange held open before its body is polled costs no allocation here.
#[derive(Debug)]
pub(crate) struct Reader {
    pub(super) table: Arc<Table>,
    /// The digest of the session whose ids are restored.
    pub(super) session: u64,
    /// The session and the stream whose abandoned request answers free (a
    /// resumed `GET`).
    pub(super) resumes: Option<(HeaderValue, Resumed)>,
    /// The last event id changes the registration learned of.
    pub(super) event_ids: u64,
    /// The longest id token held back.
    pub(super) max_id: usize,
    /// Client ids may be restored: the length of the body may change.
    pub(super) restores: bool,
    /// Learn every response that passes.
    pub(super) watch: bool,
    /// `application/json` (else `text/event-stream`).
    pub(super) json: bool,
    /// How many requests the POST carried (a batch's answers to remember).
    pub(super) requests: usize,
    pub(super) streaming: Option<Box<Streaming>>,
}

#[derive(Debug)]
pub(super) struct Streaming {
    stream: Framing,
    /// What the restorer hands on: joined into one piece when the body is
    /// restored, dropped when it is only watched.
    scratch: VecDeque<Bytes>,
}

impl Reader {
    fn streaming(&mut self) -> &mut Streaming {
        let (max_id, watch, restores, json) = (self.max_id, self.watch, self.restores, self.json);
        let requests = self.requests;
        let (table, session) = (&self.table, self.session);
        self.streaming.get_or_insert_with(|| {
            let binding = Binding {
                minter: Arc::clone(table.minter()),
                session,
            };
            let stream = if json {
                let restorer = Restorer::new(max_id, watch)
                    .bound(binding)
                    .answering_up_to(requests);
                Framing::Json {
                    restorer: if restores {
                        restorer
                    } else {
                        restorer.without_restoring()
                    },
                    offset: 0,
                    last: None,
                    lead: Lead::Undecided(None),
                }
            } else {
                let rewriter = Rewriter::new(max_id, watch)
                    .bound(binding)
                    .answering_up_to(requests);
                Framing::Sse(if restores {
                    rewriter
                } else {
                    rewriter.without_restoring()
                })
            };
            Box::new(Streaming {
                stream,
                scratch: VecDeque::new(),
            })
        })
    }

    /// Reads a chunk; returns what can go on, as one piece. A body that is
    /// only watched goes on as it came (the restorer would hand back the
    /// same bytes, in more pieces and later), and costs no queue.
    pub(super) fn push(&mut self, chunk: Bytes) -> Option<Bytes> {
        let restores = self.restores;
        let Streaming { stream, scratch } = self.streaming();
        if restores {
            stream.push(chunk, scratch);
            return coalesce(scratch);
        }
        stream.read(chunk.clone(), scratch);
        scratch.clear();
        match stream {
            Framing::Json { last, .. } => last.replace(chunk),
            Framing::Sse(_) => Some(chunk),
        }
    }

    /// How many bytes of a body only watched are held back (a JSON body's
    /// last piece), for the size the client is still to get.
    pub(super) fn held(&self) -> u64 {
        match self.streaming.as_deref() {
            Some(Streaming {
                stream: Framing::Json {
                    last: Some(last), ..
                },
                ..
            }) => last.len() as u64,
            _ => 0,
        }
    }

    /// The body ended: whatever was held, as one piece.
    pub(super) fn finish(&mut self) -> Option<Bytes> {
        let restores = self.restores;
        let Streaming { stream, scratch } = self.streaming();
        if restores {
            stream.finish(scratch);
            return coalesce(scratch);
        }
        let last = match stream {
            Framing::Json { last, .. } => last.take(),
            Framing::Sse(_) => None,
        };
        stream.finish(scratch);
        scratch.clear();
        last
    }

    /// Reads a chunk of the body and hands what passed on: what can go on
    /// now. Every awaited response passed: the registration is released
    /// before the answer's last bytes go on, even if the server keeps the
    /// stream open.
    pub(crate) fn chunk(
        &mut self,
        chunk: Bytes,
        registration: &mut Option<Registration>,
    ) -> Option<Bytes> {
        let next = self.push(chunk);
        if !self.settle(registration) {
            registration.take();
        }
        next
    }

    /// The body ended: what was held goes on. The registration is released
    /// before the last pieces go on; what did not pass stays abandoned.
    pub(crate) fn end(&mut self, registration: &mut Option<Registration>) -> Option<Bytes> {
        let last = self.finish();
        self.settle(registration);
        registration.take();
        last
    }

    /// Hands what passed to whoever waits for it: the registration, or the
    /// table for a session's stream. Returns whether responses are still
    /// awaited.
    pub(super) fn settle(&mut self, registration: &mut Option<Registration>) -> bool {
        let Some(streaming) = &mut self.streaming else {
            return registration.as_ref().is_some_and(Registration::awaits_any);
        };
        note_restored(&self.table, streaming.stream.take_restored());
        let refused = streaming.stream.take_refused();
        if refused > 0 {
            self.table.note_refused(refused);
        }
        // Where a client would resume the request's stream from, should it
        // end before the answer; on a resumed stream, where a client would
        // resume it again (the server may close it again).
        if let Framing::Sse(rewriter) = &streaming.stream {
            if rewriter.event_id_changes() != self.event_ids {
                self.event_ids = rewriter.event_id_changes();
                if let Some(event_id) = rewriter.last_event_id() {
                    match (&mut *registration, &self.resumes) {
                        (Some(registration), _) => registration.note_stream(event_id),
                        (None, Some((session, origin))) => {
                            self.table.resumed_to(session.as_bytes(), *origin, event_id);
                        }
                        (None, None) => {}
                    }
                }
            }
        }
        let answered = streaming.stream.take_answered();
        if let Some((session, resumed)) = &self.resumes {
            for (key, restored) in answered {
                // Only an id the server knew as the client's own can be
                // abandoned; a restored one was unique.
                if !restored {
                    self.table.answered_on_resume(
                        session.as_bytes(),
                        key.as_bytes(),
                        resumed.origin,
                    );
                }
            }
            return false;
        }
        registration
            .as_mut()
            .is_some_and(|registration| registration.note_answered(answered))
    }
}

/// How a read body is framed.
#[derive(Debug)]
enum Framing {
    /// One JSON text (`application/json`). The last piece is held until the
    /// body ends, so the registration is released before the client has the
    /// whole response and an immediate reuse of the id never collides.
    Json {
        restorer: Restorer,
        offset: usize,
        last: Option<Bytes>,
        lead: Lead,
    },
    /// A `text/event-stream`.
    Sse(Rewriter),
}

/// Whether a JSON body starts with a UTF-8 byte order mark. A browser's or
/// Node's `fetch` decodes the body as UTF-8, which drops one, so such a
/// client reads the JSON after it: the guard reads (and restores) from there
/// too, and passes the mark on.
#[derive(Debug)]
enum Lead {
    /// Fewer than three bytes seen, all of them the mark's so far: held.
    Undecided(Option<Bytes>),
    /// The JSON text starts at this offset (3 after a mark, else 0).
    From(usize),
}

/// A UTF-8 byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

impl Lead {
    /// Takes the next chunk; returns what to read now (the bytes held so
    /// far joined to it) and where the JSON text starts, or `None` while the
    /// lead is still undecided (the chunk is held).
    fn take(&mut self, chunk: Bytes) -> Option<(Bytes, usize)> {
        let held = match self {
            Lead::From(start) => return Some((chunk, *start)),
            Lead::Undecided(held) => held,
        };
        let chunk = match held.take() {
            Some(held) => [held, chunk].concat().into(),
            None => chunk,
        };
        if chunk.len() < BOM.len() && BOM.starts_with(&chunk) {
            *held = Some(chunk);
            return None;
        }
        let start = if chunk.starts_with(BOM) { BOM.len() } else { 0 };
        *self = Lead::From(start);
        Some((chunk, start))
    }
}

impl Framing {
    /// Feeds a chunk to the restorer; what it lets go goes to `pieces`.
    fn read(&mut self, chunk: Bytes, pieces: &mut VecDeque<Bytes>) {
        match self {
            Framing::Json {
                restorer,
                offset,
                lead,
                ..
            } => {
                let Some((chunk, json_start)) = lead.take(chunk) else {
                    return;
                };
                let start = *offset;
                *offset += chunk.len();
                let json = start.max(json_start)..*offset;
                let parts: &[Part] = if json.is_empty() {
                    &[]
                } else {
                    &[Part::Json(json)]
                };
                restorer.push(&chunk, start, parts, pieces);
            }
            Framing::Sse(rewriter) => rewriter.push(chunk, pieces),
        }
    }

    /// Reads a chunk; appends what can go on to `out`, which is empty (a
    /// JSON body's last piece is held back).
    fn push(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) {
        debug_assert!(out.is_empty(), "the caller took what went on before");
        self.read(chunk, out);
        if let Framing::Json { last, .. } = self {
            // The new last piece is held back; the one held before goes
            // first.
            if let Some(newest) = out.pop_back() {
                if let Some(held) = last.replace(newest) {
                    out.push_front(held);
                }
            }
        }
    }

    /// The body ended: whatever is held goes to `out`.
    fn finish(&mut self, out: &mut VecDeque<Bytes>) {
        match self {
            Framing::Json {
                restorer,
                offset,
                last,
                lead,
            } => {
                out.extend(last.take());
                // A body of one or two bytes of a mark: no mark, read as it is.
                if let Lead::Undecided(Some(held)) = std::mem::replace(lead, Lead::From(0)) {
                    let start = *offset;
                    *offset += held.len();
                    restorer.push(&held, start, &[Part::Json(start..*offset)], out);
                }
                restorer.push(&Bytes::new(), *offset, &[Part::End(*offset)], out);
                restorer.finish(out);
            }
            Framing::Sse(rewriter) => rewriter.finish(out),
        }
    }

    fn take_restored(&mut self) -> usize {
        match self {
            Framing::Json { restorer, .. } => restorer.take_restored(),
            Framing::Sse(rewriter) => rewriter.take_restored(),
        }
    }

    fn take_refused(&mut self) -> usize {
        match self {
            Framing::Json { restorer, .. } => restorer.take_refused(),
            Framing::Sse(rewriter) => rewriter.take_refused(),
        }
    }

    fn take_answered(&mut self) -> smallvec::Drain<'_, [Delivered; 1]> {
        match self {
            Framing::Json { restorer, .. } => restorer.take_answered(),
            Framing::Sse(rewriter) => rewriter.take_answered(),
        }
    }
}

fn note_restored(table: &Table, count: usize) {
    if count > 0 {
        table.note_restored(count);
        tracing::debug!(count, "restored client ids in a response");
    }
}

/// Everything ready to go on, as one frame. Restoring splices a chunk into
/// pieces (the bytes around each id it rewrites), and each frame becomes an
/// HTTP/1 chunk or an HTTP/2 DATA frame of its own: a batch answer of 8 MiB
/// with an id every few dozen bytes left as 381 323 chunks (+27 % on the
/// wire). Joined, an answer leaves in no more frames than it came in. The one
/// copy is paid only where a chunk was spliced; a chunk that passes whole
/// goes on as it is.
fn coalesce(pieces: &mut VecDeque<Bytes>) -> Option<Bytes> {
    if pieces.len() <= 1 {
        return pieces.pop_front();
    }
    let mut joined = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
    for piece in pieces.drain(..) {
        joined.extend_from_slice(&piece);
    }
    Some(joined.freeze())
}
