use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::client::ClientShares;

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
    pub(super) fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    pub(super) fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// The shared budget: every byte held, and the bytes of bodies that may not
/// reach into the reserve (every body but a small one whose bytes have all
/// arrived).
#[derive(Debug)]
pub(super) struct Shared {
    limit: usize,
    reserve: usize,
    small_body_bytes: usize,
    /// The share of each client address, if bounded.
    clients: Option<ClientShares>,
    held: Mutex<Held>,
    bodies: AtomicUsize,
}

#[derive(Debug, Default)]
struct Held {
    /// Every body's bytes: at most the limit.
    bytes: usize,
    /// The bytes of bodies the reserve is not for: at most the limit less
    /// the reserve.
    unreserved: usize,
}

impl Shared {
    /// A body holding `from` bytes grows to `to`, if that fits; `reserved`
    /// says, before and after, whether the reserve is for it.
    fn grow(&self, (from, to): (usize, usize), (was, is): (bool, bool)) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(bytes) = held
            .bytes
            .checked_add(to - from)
            .filter(|b| *b <= self.limit)
        else {
            return false;
        };
        let unreserved = held.unreserved - if was { 0 } else { from } + if is { 0 } else { to };
        if unreserved > held.unreserved && unreserved > self.limit - self.reserve {
            return false;
        }
        *held = Held { bytes, unreserved };
        true
    }

    fn give_back(&self, bytes: usize, reserved: bool) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.bytes -= bytes;
        if !reserved {
            held.unreserved -= bytes;
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
    /// The budget the `mcp-id-guard` binary and the Python middleware hold
    /// by default: 64 MiB.
    pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

    /// The share of one client address they allow by default: half the
    /// budget, so that one address alone cannot hold it all and two can
    /// (behind a TLS terminator every client has the terminator's address).
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::BodyBudget;
    ///
    /// let share = BodyBudget::default_share(BodyBudget::DEFAULT_MAX_BYTES);
    /// assert_eq!(share, 32 * 1024 * 1024);
    /// ```
    pub const fn default_share(max_bytes: usize) -> usize {
        max_bytes / 2
    }

    /// A budget of `max_bytes`, an eighth of it kept for bodies of at most
    /// 64 KiB; no share per client address.
    pub fn new(max_bytes: usize) -> Self {
        Self::with(max_bytes, max_bytes / RESERVE_SHARE, SMALL_BODY_BYTES, None)
    }

    fn with(
        limit: usize,
        reserve: usize,
        small_body_bytes: usize,
        per_client: Option<usize>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                limit,
                reserve: reserve.min(limit),
                small_body_bytes,
                clients: per_client.map(ClientShares::new),
                held: Mutex::new(Held::default()),
                bodies: AtomicUsize::new(0),
            }),
        }
    }

    /// A new budget of the same size that keeps `reserve_bytes` of it
    /// (at most all of it) for bodies of at most `small_body_bytes`: bodies
    /// larger than that, and bodies still arriving, together hold at most
    /// the rest: the reserve is for small bodies whose bytes have all
    /// arrived ([`HeldBody::complete`]), which the server can take at once.
    /// `0` keeps nothing back.
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
    /// let mut slow = budget.hold();
    /// assert!(slow.grow_to(10).is_err(), "nor for a body still arriving");
    /// let mut small = budget.hold();
    /// assert!(small.complete(4096).is_ok(), "the reserve is for it");
    /// ```
    pub fn reserve_for_small_bodies(self, reserve_bytes: usize, small_body_bytes: usize) -> Self {
        let per_client = self.per_client_limit();
        Self::with(self.limit(), reserve_bytes, small_body_bytes, per_client)
    }

    /// A new budget of the same size whose bodies from one client
    /// address hold at most `max_bytes` together, across its connections,
    /// when they are held for the address ([`hold_for`](Self::hold_for),
    /// [`BodyBufferLayer::for_client`](super::BodyBufferLayer::for_client)).
    /// Every body still arriving counts against it, whatever its size; a
    /// small body whose bytes have all arrived does not (it draws on the
    /// reserve), so that behind a TLS terminator or a balancer, where every
    /// client has its address, one client filling the address's share does
    /// not lock the others' small requests out. A bound on one address, not on one
    /// attacker (addresses are cheap to come by): charging what arrived
    /// and the reserve do not depend on it.
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::BodyBudget;
    ///
    /// let budget = BodyBudget::new(1 << 20)
    ///     .reserve_for_small_bodies(1 << 10, 10)
    ///     .per_client(100);
    /// let client = "192.0.2.1".parse()?;
    /// let mut first = budget.hold_for(client);
    /// let mut second = budget.hold_for(client);
    /// assert!(first.grow_to(60).is_ok());
    /// assert!(second.grow_to(41).is_err(), "the address holds 60 of its 100");
    /// assert!(second.complete(10).is_ok(), "a small body draws on the reserve");
    /// let mut other = budget.hold_for("192.0.2.2".parse()?);
    /// assert!(other.grow_to(100).is_ok());
    /// # Ok::<(), std::net::AddrParseError>(())
    /// ```
    pub fn per_client(self, max_bytes: usize) -> Self {
        let shared = &self.shared;
        Self::with(
            shared.limit,
            shared.reserve,
            shared.small_body_bytes,
            Some(max_bytes),
        )
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

    /// What the bodies of one client address may hold, if bounded
    /// ([`per_client`](Self::per_client)).
    pub fn per_client_limit(&self) -> Option<usize> {
        self.shared.clients.as_ref().map(ClientShares::limit)
    }

    /// The share of `client`, if the budget has shares per address.
    pub(super) fn client_share(&self, client: IpAddr) -> Option<Arc<Counter>> {
        Some(self.shared.clients.as_ref()?.share(client))
    }

    /// Starts holding one body whose bytes the caller reads: it is charged
    /// as it grows ([`HeldBody::grow_to`], [`HeldBody::complete`] for the
    /// last bytes) and gives its bytes back when dropped. For a server that reads bodies without
    /// [`BodyBufferLayer`](super::BodyBufferLayer).
    ///
    /// ```
    /// use mcp_id_guard::protect::buffer::BodyBudget;
    ///
    /// let budget = BodyBudget::new(1 << 20);
    /// let mut body = budget.hold();
    /// assert_eq!(budget.bodies(), 1);
    /// let mut read = Vec::new();
    /// let chunks = [&b"{\"jsonrpc\":"[..], &b"\"2.0\"}"[..]];
    /// for (index, chunk) in chunks.iter().enumerate() {
    ///     let size = read.len() + chunk.len();
    ///     if index + 1 < chunks.len() {
    ///         body.grow_to(size)?;
    ///     } else {
    ///         body.complete(size)?;
    ///     }
    ///     read.extend_from_slice(chunk);
    /// }
    /// assert_eq!((budget.used(), body.held()), (17, 17));
    /// drop(body);
    /// assert_eq!((budget.used(), budget.bodies()), (0, 0));
    /// # Ok::<(), mcp_id_guard::protect::buffer::OverBudget>(())
    /// ```
    pub fn hold(&self) -> HeldBody {
        HeldBody(Charge::new((None, None), Arc::clone(&self.shared)))
    }

    /// [`hold`](Self::hold), counted also against the share of `client`
    /// if the budget has shares per address ([`per_client`](Self::per_client)).
    pub fn hold_for(&self, client: IpAddr) -> HeldBody {
        HeldBody(Charge::new(
            (self.client_share(client), None),
            Arc::clone(&self.shared),
        ))
    }
}

/// One body's bytes held against a [`BodyBudget`]
/// ([`BodyBudget::hold`]); given back when dropped.
#[derive(Debug)]
pub struct HeldBody(Charge);

impl HeldBody {
    /// Holds `bytes` in all (never less than already held) of a body still
    /// arriving, if they fit what the budget has left for such bodies (not
    /// the reserve); else holds what it held and the body should be refused
    /// (`503`).
    pub fn grow_to(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.0.grow_to(bytes, false).map_err(|_| OverBudget)
    }

    /// Holds `bytes` in all of a body whose bytes have now all arrived: a
    /// small one may draw on the reserve. Refused (`503`) as
    /// [`grow_to`](Self::grow_to) is.
    pub fn complete(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.0.grow_to(bytes, true).map_err(|_| OverBudget)
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

/// The bytes one body holds against its connection's share (if any), its
/// client address's (if any: the bytes of a large body only, small ones
/// draw on the reserve) and the shared budget; given back when dropped. It
/// counts as a body held from the start.
#[derive(Debug)]
pub(super) struct Charge {
    client: Option<Arc<Counter>>,
    connection: Option<Arc<Counter>>,
    shared: Arc<Shared>,
    held: usize,
    /// The body is small and all of it has arrived: the reserve is for it.
    reserved: bool,
}

impl Charge {
    pub(super) fn new(
        (client, connection): (Option<Arc<Counter>>, Option<Arc<Counter>>),
        shared: Arc<Shared>,
    ) -> Self {
        shared.bodies.fetch_add(1, Ordering::AcqRel);
        Self {
            client,
            connection,
            shared,
            held: 0,
            reserved: false,
        }
    }

    /// The bytes held.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// The largest body that may draw on the reserve.
    pub(super) fn small_body_bytes(&self) -> usize {
        self.shared.small_body_bytes
    }

    /// What the client's share holds of this body: all of it, unless the
    /// reserve is for it (a small body whose bytes have all arrived).
    fn client_part(&self) -> usize {
        if self.reserved {
            0
        } else {
            self.held
        }
    }

    /// Holds `bytes` in all, taking the difference from every budget;
    /// `complete`: every byte of the body has arrived (a small body may then
    /// draw on the reserve, and leaves its client's share).
    pub(super) fn grow_to(&mut self, bytes: usize, complete: bool) -> Result<(), Over> {
        let bytes = bytes.max(self.held);
        let more = bytes - self.held;
        let reserved = complete && bytes <= self.shared.small_body_bytes;
        if more == 0 && reserved == self.reserved {
            return Ok(());
        }
        let client_before = self.client_part();
        let client_after = if reserved { 0 } else { bytes };
        let client_more = client_after.saturating_sub(client_before);
        let give_back = |client: bool, connection: bool| {
            if let (true, Some(share)) = (client, &self.client) {
                share.give_back(client_more);
            }
            if let (true, Some(share)) = (connection, &self.connection) {
                share.give_back(more);
            }
        };
        if let Some(share) = &self.client {
            if !share.take(client_more) {
                return Err(Over::Budget);
            }
        }
        if let Some(share) = &self.connection {
            if !share.take(more) {
                give_back(true, false);
                return Err(Over::Budget);
            }
        }
        if !self
            .shared
            .grow((self.held, bytes), (self.reserved, reserved))
        {
            give_back(true, true);
            return Err(Over::Budget);
        }
        if let (Some(share), true) = (&self.client, client_before > client_after) {
            share.give_back(client_before - client_after);
        }
        (self.held, self.reserved) = (bytes, reserved);
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.held > 0 {
            if let Some(share) = &self.client {
                share.give_back(self.client_part());
            }
            if let Some(share) = &self.connection {
                share.give_back(self.held);
            }
            self.shared.give_back(self.held, self.reserved);
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
        let mut first = Charge::new((None, Some(Arc::clone(&connection))), Arc::clone(total));
        assert_eq!(first.grow_to(6, false), Ok(()));
        assert_eq!(first.grow_to(4, false), Ok(()), "never shrinks");
        let mut second = Charge::new((None, Some(Arc::clone(&connection))), Arc::clone(total));
        assert_eq!(
            second.grow_to(5, false),
            Err(Over::Budget),
            "the connection's share"
        );
        assert_eq!((connection.used(), budget.used()), (6, 6));
        let other = Arc::new(Counter::new(10));
        let mut third = Charge::new((None, Some(Arc::clone(&other))), Arc::clone(total));
        assert_eq!(
            third.grow_to(10, false),
            Err(Over::Budget),
            "the shared budget"
        );
        assert_eq!((other.used(), budget.used()), (0, 6), "nothing kept");
        assert_eq!(third.grow_to(9, false), Ok(()));
        assert_eq!(budget.bodies(), 3, "held bodies, bytes or not");
        drop(first);
        drop(third);
        assert_eq!((connection.used(), other.used(), budget.used()), (0, 0, 0));
        drop(second);
        assert_eq!(budget.bodies(), 0);
    }

    /// Bodies still arriving, and large ones, stop short of the reserve;
    /// small complete ones may use all of the budget; a complete body that
    /// is not small, or a small one not complete, stays out of it.
    #[test]
    fn the_reserve_is_for_small_complete_bodies() {
        let budget = BodyBudget::new(100).reserve_for_small_bodies(30, 10);
        let mut large = budget.hold();
        assert_eq!(large.grow_to(71), Err(OverBudget), "into the reserve");
        assert_eq!(large.grow_to(60), Ok(()));
        let mut arriving = budget.hold();
        assert_eq!(arriving.grow_to(10), Ok(()), "within the rest");
        assert_eq!(
            arriving.grow_to(11),
            Err(OverBudget),
            "not into the reserve"
        );
        let mut small: Vec<HeldBody> = (0..3).map(|_| budget.hold()).collect();
        for body in &mut small {
            assert_eq!(body.complete(10), Ok(()));
        }
        assert_eq!(budget.used(), 100, "small complete bodies take the rest");
        let mut last = budget.hold();
        assert_eq!(last.complete(1), Err(OverBudget), "the budget is full");
        drop(small.pop());
        assert_eq!(
            last.complete(11),
            Err(OverBudget),
            "complete, but not small: 70 + 11 bytes would reach into the reserve"
        );
        assert_eq!(
            arriving.complete(10),
            Ok(()),
            "its last bytes came: it moves into the reserve"
        );
        assert_eq!(last.grow_to(10), Ok(()), "room it left");
        assert_eq!(budget.used(), 100);
        drop(large);
        drop(small);
        drop(arriving);
        drop(last);
        assert_eq!((budget.used(), budget.bodies()), (0, 0));
    }
}
