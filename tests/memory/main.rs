//! Memory: what the guard holds, measured with a counting global allocator
//! (one per test binary, so these tests share this one): the bookkeeping per
//! in-flight request and its release (`bound`), that responses are restored
//! in bounded memory whatever their size (`bound`), and what a hostile client
//! can make the session table hold (`fail_closed`).
//!
//! The allocator tracks the bytes each thread has requested and not yet
//! freed (`Layout::size`, allocator overhead excluded), and the peak of that
//! since [`reset_peak`]. Every measurement runs on the test's own thread, so
//! tests running in parallel do not disturb each other's counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod bound;
mod fail_closed;

// ---------------------------------------------------------------------------
// The counting allocator
// ---------------------------------------------------------------------------

/// `System`, counting the live bytes of each thread.
struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed by this thread. A `const` `Cell`
    /// needs no lazy initialisation and no destructor, so using it inside the
    /// allocator cannot recurse into it.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the last [`reset_peak`].
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

/// Starts a new peak measurement at the current live bytes.
pub(crate) fn reset_peak() {
    PEAK.with(|peak| peak.set(live()));
}

/// The highest live bytes since [`reset_peak`].
pub(crate) fn peak() -> isize {
    PEAK.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counting has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            track(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            track(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(pointer, layout) };
        track(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes this thread holds now.
pub(crate) fn live() -> isize {
    LIVE.with(Cell::get)
}
