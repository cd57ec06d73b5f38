use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// The bytes of request bodies every connection may hold at once: shared
/// by each [`BodyBufferLayer`](super::BodyBufferLayer) given a clone. Cheap
/// to clone.
///
/// ```
/// use mcp_id_guard::protect::buffer::BodyBudget;
///
/// let budget = BodyBudget::new(64 * 1024 * 1024);
/// assert_eq!((budget.used(), budget.limit()), (0, 64 * 1024 * 1024));
/// ```
#[derive(Debug, Clone)]
pub struct BodyBudget {
    pub(super) total: Arc<Counter>,
}

impl BodyBudget {
    /// A budget of `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            total: Arc::new(Counter::new(max_bytes)),
        }
    }

    /// Bytes held now, across every connection.
    pub fn used(&self) -> usize {
        self.total.used()
    }

    /// The budget.
    pub fn limit(&self) -> usize {
        self.total.limit
    }
}

/// Which limit a body ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Over {
    /// The size cap (413).
    Size,
    /// The connection's share or the shared budget (503).
    Budget,
}

/// The bytes one body holds against its connection's share and the shared
/// budget; given back when dropped.
#[derive(Debug)]
pub(super) struct Charge {
    connection: Arc<Counter>,
    total: Arc<Counter>,
    held: usize,
}

impl Charge {
    pub(super) fn new(connection: Arc<Counter>, total: Arc<Counter>) -> Self {
        Self {
            connection,
            total,
            held: 0,
        }
    }

    /// Holds `bytes` in all, taking the difference from both budgets.
    pub(super) fn grow_to(&mut self, bytes: usize) -> Result<(), Over> {
        let Some(more) = bytes.checked_sub(self.held).filter(|more| *more > 0) else {
            return Ok(());
        };
        if !self.connection.take(more) {
            return Err(Over::Budget);
        }
        if !self.total.take(more) {
            self.connection.give_back(more);
            return Err(Over::Budget);
        }
        self.held = bytes;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.held > 0 {
            self.connection.give_back(self.held);
            self.total.give_back(self.held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_both_budgets_and_are_given_back() {
        let connection = Arc::new(Counter::new(10));
        let total = Arc::new(Counter::new(15));
        let mut first = Charge::new(Arc::clone(&connection), Arc::clone(&total));
        assert_eq!(first.grow_to(6), Ok(()));
        assert_eq!(first.grow_to(4), Ok(()), "never shrinks");
        let mut second = Charge::new(Arc::clone(&connection), Arc::clone(&total));
        assert_eq!(
            second.grow_to(5),
            Err(Over::Budget),
            "the connection's share"
        );
        assert_eq!((connection.used(), total.used()), (6, 6));
        let other = Arc::new(Counter::new(10));
        let mut third = Charge::new(Arc::clone(&other), Arc::clone(&total));
        assert_eq!(third.grow_to(10), Err(Over::Budget), "the shared budget");
        assert_eq!((other.used(), total.used()), (0, 6), "nothing kept");
        assert_eq!(third.grow_to(9), Ok(()));
        drop(first);
        drop(third);
        assert_eq!((connection.used(), other.used(), total.used()), (0, 0, 0));
        drop(second);
    }
}
