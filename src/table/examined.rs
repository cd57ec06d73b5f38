//! A count of the entries and ids the table's lookups examine, for the tests
//! that keep tracking linear in a batch's size without timing anything. It
//! counts only in the crate's own unit tests; elsewhere it compiles to
//! nothing.

#[cfg(test)]
thread_local! {
    static EXAMINED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// One more entry or id examined (on this thread).
#[inline(always)]
pub(super) fn one() {
    #[cfg(test)]
    EXAMINED.with(|count| count.set(count.get() + 1));
}

/// One more for each item `items` yields.
#[inline(always)]
pub(super) fn each<T>(items: impl Iterator<Item = T>) -> impl Iterator<Item = T> {
    items.inspect(|_| one())
}

/// How many were examined on this thread since the last call.
#[cfg(test)]
pub(super) fn take() -> u64 {
    EXAMINED.with(|count| count.replace(0))
}
