use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::budget::Counter;

/// The share of each client address, while any of its connections (or
/// bodies) holds it: an address none holds is forgotten, so the map is
/// bounded by the open connections.
#[derive(Debug)]
pub(super) struct ClientShares {
    limit: usize,
    shares: Mutex<Shares>,
}

#[derive(Debug, Default)]
struct Shares {
    by_address: HashMap<IpAddr, Weak<Counter>>,
    /// The size at which forgotten addresses are swept out next: twice the
    /// live ones after a sweep, so a sweep costs O(1) per insertion.
    sweep_at: usize,
}

/// Fewest entries before a sweep.
const MIN_SWEEP: usize = 64;

impl ClientShares {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            shares: Mutex::new(Shares::default()),
        }
    }

    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// The share of `client`, the one its other holders count against.
    pub(super) fn share(&self, client: IpAddr) -> Arc<Counter> {
        // IPv4 clients of a dual-stack listener count as themselves.
        let client = client.to_canonical();
        let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(share) = shares.by_address.get(&client).and_then(Weak::upgrade) {
            return share;
        }
        if shares.by_address.len() >= shares.sweep_at.max(MIN_SWEEP) {
            shares
                .by_address
                .retain(|_, share| share.strong_count() > 0);
            shares.sweep_at = shares.by_address.len() * 2;
        }
        let share = Arc::new(Counter::new(self.limit));
        shares.by_address.insert(client, Arc::downgrade(&share));
        share
    }

    #[cfg(test)]
    pub(super) fn addresses(&self) -> usize {
        self.shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_address
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One share per address while it is held, swept out once no one holds
    /// it; an IPv4-mapped IPv6 address is its IPv4 address.
    #[test]
    fn one_share_per_address_while_held() {
        let shares = ClientShares::new(10);
        let first = shares.share([192, 0, 2, 1].into());
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert!(Arc::ptr_eq(&first, &shares.share(mapped)));
        let held: Vec<_> = (0..100u8)
            .map(|n| shares.share([198, 51, 100, n].into()))
            .collect();
        drop(held);
        for n in 0..100u8 {
            drop(shares.share([203, 0, 113, n].into()));
        }
        assert!(
            shares.addresses() <= 2 * MIN_SWEEP + 1,
            "{}",
            shares.addresses()
        );
        assert!(Arc::ptr_eq(&first, &shares.share([192, 0, 2, 1].into())));
    }
}
