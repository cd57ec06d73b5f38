//! Limits derived from the process's file-descriptor budget.

/// Descriptors kept for everything that is not a client, upstream or admin
/// connection: the listeners, stdio, the runtime's own.
const RESERVED_DESCRIPTORS: u64 = 16;

/// The budget when the limit is unlimited or cannot be read.
const FALLBACK_DESCRIPTORS: u64 = 1 << 20;

/// The largest derived connection cap, whatever the limit says (some
/// systems report limits near 2^63).
const MAX_DERIVED_CONNECTIONS: u64 = 1 << 20;

/// The soft `RLIMIT_NOFILE`: how many descriptors this process may open.
pub(crate) fn descriptor_limit() -> u64 {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, Resource};
        getrlimit(Resource::Nofile)
            .current
            .unwrap_or(FALLBACK_DESCRIPTORS)
    }
    #[cfg(not(unix))]
    {
        FALLBACK_DESCRIPTORS
    }
}

/// Half of the descriptors left after the reserve and the `admin`
/// connections (`--admin-max-connections`):
/// each client connection may need an upstream connection beside it, so
/// client and upstream connections together stay within the limit and
/// `accept` does not fail with "too many open files".
pub(crate) fn connections_for(descriptors: u64, admin: usize) -> usize {
    let admin = u64::try_from(admin).unwrap_or(u64::MAX);
    let half = descriptors
        .saturating_sub(RESERVED_DESCRIPTORS)
        .saturating_sub(admin)
        / 2;
    usize::try_from(half.clamp(1, MAX_DERIVED_CONNECTIONS)).unwrap_or(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_budget() {
        assert_eq!(connections_for(1024, 16), 496);
        assert_eq!(connections_for(1024, 64), 472);
        assert_eq!(connections_for(64, 16), 16);
        assert_eq!(connections_for(10, 16), 1);
        assert_eq!(connections_for(u64::MAX, 16), 1 << 20);
        assert!(descriptor_limit() > 0);
    }
}
