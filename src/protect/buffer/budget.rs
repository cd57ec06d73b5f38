use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A body this large or smaller is small: it may draw on the reserve.
const SMALL_BODY_BYTES: usize = 64 * 1024;

/// The part of a budget kept for small bodies by default: an eighth.
const RESERVE_SHARE: usize = 8;

/// A count of bytes held against a limit, shared by whoever holds them.
#[derive(Debug)]
pub(super) struct Counter {
    limit: usize,
    used: AtomicUsize,
}

impl Counter {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` if they fit.
    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// The shared budget: every byte held, and the bytes of large bodies, which
/// may not reach into the reserve.
#[derive(Debug)]
pub(super) struct Shared {
    limit: usize,
    reserve: usize,
    small_body_bytes: usize,
    held: Mutex<Held>,
    bodies: AtomicUsize,
}

#[derive(Debug, Default)]
struct Held {
    /// Every body's bytes: at most the limit.
    bytes: usize,
    /// The bytes of bodies over the small size: at most the limit less the
    /// reserve.
    large: usize,
}

impl Shared {
    /// A body holding `from` bytes grows to `to`, if that fits.
    fn grow(&self, from: usize, to: usize) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(bytes) = held
            .bytes
            .checked_add(to - from)
            .filter(|b| *b <= self.limit)
        else {
            return false;
        };
        let large = if to <= self.small_body_bytes {
            held.large
        } else if from <= self.small_body_bytes {
            // No longer small: all of it moves out of the reserve's reach.
            held.large.saturating_add(to)
        } else {
            held.large.saturating_add(to - from)
        };
        if large > self.limit - self.reserve {
            return false;
        }
        *held = Held { bytes, large };
        true
    }

    fn give_back(&self, bytes: usize) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.bytes -= bytes;
        if bytes > self.small_body_bytes {
            held.large -= bytes;
        }
    }
}

/// The bytes of request bodies every connection may hold at once: shared
/// by each [`BodyBufferLayer`](super::BodyBufferLayer) given a clone, and
/// by any other reader of bodies ([`hold`](Self::hold)). Cheap to clone.
///
/// A body is charged for what has arrived of it, never for what its
/// `Content-Length` announces; a part of the budget (an eighth by default)
/// is kept for small bodies (64 KiB at most by default), which large bodies
/// cannot take: see the [module docs](super).
///
/// ```
/// use mcp_id_guard::protect::buffer::BodyBudget;
///
/// let budget = BodyBudget::new(64 * 1024 * 1024);
/// assert_eq!((budget.used(), budget.bodies()), (0, 0));
/// assert_eq!(budget.limit(), 64 * 1024 * 1024);
/// assert_eq!(budget.small_body_reserve(), 8 * 1024 * 1024);
/// assert_eq!(budget.small_body_bytes(), 64 * 1024);
/// ```
#[derive(Debug, Clone)]
pub struct BodyBudget {
    pub(super) shared: Arc<Shared>,
}

impl BodyBudget {
    /// A budget of `max_bytes`, an eighth of it kept for bodies of at most
    /// 64 KiB.
    pub fn new(max_bytes: usize) -> Self {
        Self::with_reserve(max_bytes, max_bytes / RESERVE_SHARE, SMALL_BODY_BYTES)
    }

    fn with_reserve(limit: usize, reserve: usize, small_body_bytes: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                limit,
                reserve: reserve.min(limit),
                small_body_bytes,
                held: Mutex::new(Held::default()),
                bodies: AtomicUsize::new(0),
            }),
        }
    }

    /// A new budget of the same size that keeps `reserve_bytes` of it
    /// (at most all of it) for bodies of at most `small_body_bytes`: bodies
    /// larger than that together hold at most the rest. `0` keeps nothing
    /// back.
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::BodyBudget;
    ///
    /// let budget = BodyBudget::new(1 << 20).reserve_for_small_bodies(256 << 10, 4096);
    /// assert_eq!(budget.small_body_reserve(), 256 << 10);
    /// assert_eq!(budget.small_body_bytes(), 4096);
    ///
    /// let mut large = budget.hold();
    /// assert!(large.grow_to(768 << 10).is_ok());
    /// assert!(large.grow_to((768 << 10) + 1).is_err(), "the reserve is not for it");
    /// let mut small = budget.hold();
    /// assert!(small.grow_to(4096).is_ok(), "the reserve is for it");
    /// ```
    pub fn reserve_for_small_bodies(self, reserve_bytes: usize, small_body_bytes: usize) -> Self {
        Self::with_reserve(self.limit(), reserve_bytes, small_body_bytes)
    }

    /// Bytes held now, across every connection.
    pub fn used(&self) -> usize {
        self.shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }

    /// Bodies held now (being read, or read and not yet answered), whether
    /// any of their bytes have arrived or not.
    pub fn bodies(&self) -> usize {
        self.shared.bodies.load(Ordering::Acquire)
    }

    /// The budget.
    pub fn limit(&self) -> usize {
        self.shared.limit
    }

    /// The bytes large bodies cannot take.
    pub fn small_body_reserve(&self) -> usize {
        self.shared.reserve
    }

    /// The largest body that may draw on the reserve.
    pub fn small_body_bytes(&self) -> usize {
        self.shared.small_body_bytes
    }

    /// Starts holding one body whose bytes the caller reads: it is charged
    /// as it grows ([`HeldBody::grow_to`]) and gives its bytes back when
    /// dropped. For a server that reads bodies without
    /// [`BodyBufferLayer`](super::BodyBufferLayer).
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::BodyBudget;
    ///
    /// let budget = BodyBudget::new(1 << 20);
    /// let mut body = budget.hold();
    /// assert_eq!(budget.bodies(), 1);
    /// let mut read = Vec::new();
    /// for chunk in [&b"{\"jsonrpc\":"[..], &b"\"2.0\"}"[..]] {
    ///     body.grow_to(read.len() + chunk.len())?;
    ///     read.extend_from_slice(chunk);
    /// }
    /// assert_eq!((budget.used(), body.held()), (17, 17));
    /// drop(body);
    /// assert_eq!((budget.used(), budget.bodies()), (0, 0));
    /// # Ok::<(), mcp_id_guard::protect::buffer::OverBudget>(())
    /// ```
    pub fn hold(&self) -> HeldBody {
        HeldBody(Charge::new(None, Arc::clone(&self.shared)))
    }
}

/// One body's bytes held against a [`BodyBudget`]
/// ([`BodyBudget::hold`]); given back when dropped.
#[derive(Debug)]
pub struct HeldBody(Charge);

impl HeldBody {
    /// Holds `bytes` in all (never less than already held), if they fit
    /// what the budget has left; else holds what it held and the body
    /// should be refused (`503`).
    pub fn grow_to(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.0.grow_to(bytes).map_err(|_| OverBudget)
    }

    /// The bytes held.
    pub fn held(&self) -> usize {
        self.0.held
    }
}

/// A body did not fit what its [`BodyBudget`] has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget;

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request bodies hold all the memory they may")
    }
}

impl std::error::Error for OverBudget {}

/// Which limit a body ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Over {
    /// The size cap (413).
    Size,
    /// The connection's share or the shared budget (503).
    Budget,
}

/// The bytes one body holds against its connection's share (if any) and
/// the shared budget; given back when dropped. It counts as a body held
/// from the start.
#[derive(Debug)]
pub(super) struct Charge {
    connection: Option<Arc<Counter>>,
    shared: Arc<Shared>,
    held: usize,
}

impl Charge {
    pub(super) fn new(connection: Option<Arc<Counter>>, shared: Arc<Shared>) -> Self {
        shared.bodies.fetch_add(1, Ordering::AcqRel);
        Self {
            connection,
            shared,
            held: 0,
        }
    }

    /// The largest body that may draw on the reserve.
    pub(super) fn small_body_bytes(&self) -> usize {
        self.shared.small_body_bytes
    }

    /// Holds `bytes` in all, taking the difference from both budgets.
    pub(super) fn grow_to(&mut self, bytes: usize) -> Result<(), Over> {
        let Some(more) = bytes.checked_sub(self.held).filter(|more| *more > 0) else {
            return Ok(());
        };
        if let Some(connection) = &self.connection {
            if !connection.take(more) {
                return Err(Over::Budget);
            }
        }
        if !self.shared.grow(self.held, bytes) {
            if let Some(connection) = &self.connection {
                connection.give_back(more);
            }
            return Err(Over::Budget);
        }
        self.held = bytes;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.held > 0 {
            if let Some(connection) = &self.connection {
                connection.give_back(self.held);
            }
            self.shared.give_back(self.held);
        }
        self.shared.bodies.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_both_budgets_and_are_given_back() {
        let connection = Arc::new(Counter::new(10));
        let budget = BodyBudget::new(15).reserve_for_small_bodies(0, 0);
        let total = &budget.shared;
        let mut first = Charge::new(Some(Arc::clone(&connection)), Arc::clone(total));
        assert_eq!(first.grow_to(6), Ok(()));
        assert_eq!(first.grow_to(4), Ok(()), "never shrinks");
        let mut second = Charge::new(Some(Arc::clone(&connection)), Arc::clone(total));
        assert_eq!(
            second.grow_to(5),
            Err(Over::Budget),
            "the connection's share"
        );
        assert_eq!((connection.used(), budget.used()), (6, 6));
        let other = Arc::new(Counter::new(10));
        let mut third = Charge::new(Some(Arc::clone(&other)), Arc::clone(total));
        assert_eq!(third.grow_to(10), Err(Over::Budget), "the shared budget");
        assert_eq!((other.used(), budget.used()), (0, 6), "nothing kept");
        assert_eq!(third.grow_to(9), Ok(()));
        assert_eq!(budget.bodies(), 3, "held bodies, bytes or not");
        drop(first);
        drop(third);
        assert_eq!((connection.used(), other.used(), budget.used()), (0, 0, 0));
        drop(second);
        assert_eq!(budget.bodies(), 0);
    }

    /// Large bodies stop short of the reserve; small ones may use all of
    /// the budget; a small body that grows large leaves the reserve, or is
    /// refused if the rest has no room for it.
    #[test]
    fn the_reserve_is_for_small_bodies() {
        let budget = BodyBudget::new(100).reserve_for_small_bodies(30, 10);
        let mut large = budget.hold();
        assert_eq!(large.grow_to(71), Err(OverBudget), "into the reserve");
        assert_eq!(large.grow_to(60), Ok(()));
        let mut small: Vec<HeldBody> = (0..4).map(|_| budget.hold()).collect();
        for body in &mut small {
            assert_eq!(body.grow_to(10), Ok(()));
        }
        assert_eq!(budget.used(), 100, "small bodies may take all of it");
        let mut last = budget.hold();
        assert_eq!(last.grow_to(1), Err(OverBudget), "the budget is full");
        drop(small.pop());
        assert_eq!(
            small[0].grow_to(11),
            Err(OverBudget),
            "no longer small, and 60 + 11 bytes of large bodies reach into the reserve"
        );
        assert_eq!(budget.used(), 90, "it holds what it held");
        drop(large);
        assert_eq!(small[0].grow_to(11), Ok(()));
        assert_eq!(small[1].grow_to(59), Ok(()));
        assert_eq!(small[2].grow_to(11), Err(OverBudget), "11 + 59 + 11 > 70");
        assert_eq!(budget.used(), 80);
        drop(small);
        assert_eq!((budget.used(), budget.bodies()), (0, 1));
    }
}
