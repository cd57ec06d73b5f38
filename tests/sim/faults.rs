//! The faults of a run, chosen by its seed: links held, the guard (or the
//! relay) partitioned from the upstream, a client partitioned from the
//! guard, upstream and guard restarts.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::world::{Setup, GUARD_HOST, UPSTREAM_HOST};

/// A fault, at its simulated time.
#[derive(Debug, Clone)]
pub enum Fault {
    Hold(String, String),
    Release(String, String),
    Partition,
    Repair,
    /// A client partitioned from the guard, and healed.
    Cut(String),
    Heal(String),
    RestartUpstream,
    RestartGuard,
}

/// The faults of a run, in time order; the partitions from an RNG of their
/// own (`cuts`), so that the other faults of a seed stay as they were.
/// `gateway`: the host whose link to the upstream is held (the guard's, or
/// the relay's).
pub fn faults(
    seed: u64,
    rng: &mut StdRng,
    cuts: &mut StdRng,
    setup: &Setup,
    gateway: &str,
) -> Vec<(Duration, Fault)> {
    let mut faults = Vec::new();
    if !setup.faults {
        return faults;
    }
    let window = Duration::from_secs(60);
    for _ in 0..rng.random_range(0..=3) {
        let at = window.mul_f64(rng.random());
        let held = setup.max_hold.mul_f64(rng.random());
        let pick = rng.random_range(0..=setup.clients);
        let (a, b) = if pick == setup.clients {
            (gateway.to_owned(), UPSTREAM_HOST.to_owned())
        } else {
            (format!("client-{pick}"), GUARD_HOST.to_owned())
        };
        faults.push((at, Fault::Hold(a.clone(), b.clone())));
        faults.push((at + held, Fault::Release(a, b)));
    }
    if rng.random_bool(0.5) {
        faults.push((window.mul_f64(rng.random()), Fault::RestartUpstream));
    }
    if rng.random_bool(0.3) {
        faults.push((window.mul_f64(rng.random()), Fault::RestartGuard));
    }
    if cuts.random_bool(setup.partition_rate) {
        // A hold on the same link meanwhile ends with whichever heals first
        // (turmoil keeps one state per link).
        let at = window.mul_f64(cuts.random());
        faults.push((at, Fault::Partition));
        faults.push((at + setup.max_hold.mul_f64(cuts.random()), Fault::Repair));
    }
    if let Some((at, until, client)) = client_cut(seed, setup) {
        faults.push((at, Fault::Cut(client.clone())));
        faults.push((until, Fault::Heal(client)));
    }
    faults.sort_by_key(|(at, _)| *at);
    faults
}

/// Under faults, the seed's partition of a client from the guard, if any:
/// when, until when, and which client. From an RNG of its own, so that the
/// other faults of a seed stay as they were.
pub fn client_cut(seed: u64, setup: &Setup) -> Option<(Duration, Duration, String)> {
    let mut clients = StdRng::seed_from_u64(seed ^ 0xc11e_c075);
    if !setup.faults || !clients.random_bool(setup.client_cut_rate) {
        return None;
    }
    let at = Duration::from_secs(60).mul_f64(clients.random());
    let client = format!("client-{}", clients.random_range(0..setup.clients));
    Some((at, at + setup.max_hold.mul_f64(clients.random()), client))
}
