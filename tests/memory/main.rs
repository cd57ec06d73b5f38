//! Memory: what the guard holds, measured with a counting global allocator
//! (one per test binary, so these tests share this one): the bookkeeping per
//! in-flight request and its release (`bound`), that responses are restored
//! in bounded memory whatever their size (`bound`), and what a hostile client
//! can make the session table hold (`fail_closed`), and how many times a
//! tracked request calls the allocator (`allocations`).
//!
//! The allocator tracks the bytes each thread has requested and not yet
//! freed (`Layout::size`, allocator overhead excluded), and the peak of that
//! since [`reset_peak`]. Every measurement runs on the test's own thread, so
//! tests running in parallel do not disturb each other's counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use tower::Service;

mod allocations;
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
    /// Calls to `alloc`, `alloc_zeroed` and `realloc` by this thread.
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread has asked the allocator for memory (a
/// `realloc` counts: it is a call to the allocator as costly as the rest).
pub(crate) fn allocations() -> u64 {
    CALLS.with(Cell::get)
}

fn count_call() {
    let _ = CALLS.try_with(|calls| calls.set(calls.get() + 1));
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
        count_call();
        if !pointer.is_null() {
            track(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        count_call();
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
        count_call();
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

// ---------------------------------------------------------------------------
// Driving a service on the test's thread
// ---------------------------------------------------------------------------

/// Polls a future that must be ready at once (nothing here ever waits).
pub(crate) fn ready_now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the exchange should complete without waiting"),
    }
}

/// Calls a service once, as a server would (`poll_ready`, then `call`).
pub(crate) fn call<S, R>(service: &mut S, request: R) -> S::Response
where
    S: Service<R, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    match service.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("the service should be ready"),
    }
    match ready_now(service.call(request)) {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The one-event `text/event-stream` a trivial MCP server answers `request`
/// with: a result for each of its requests, under the id it received (the
/// guard frees an id only once its answer passed). The body is a buffered
/// one, ready at once.
pub(crate) fn answer_event<B>(
    request: http::Request<mcp_id_guard::guard::GuardRequestBody<B>>,
) -> bytes::Bytes
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    use http_body::Body;
    let mut body = request.into_body();
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = Vec::new();
    while let Poll::Ready(Some(Ok(frame))) = std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
        }
    }
    let answer = |message: &serde_json::Value| serde_json::json!({"jsonrpc": "2.0", "id": message["id"], "result": {}});
    let data = match serde_json::from_slice::<serde_json::Value>(&read) {
        Ok(serde_json::Value::Array(messages)) => {
            serde_json::Value::Array(messages.iter().map(answer).collect())
        }
        Ok(message) => answer(&message),
        Err(_) => serde_json::json!({"jsonrpc": "2.0", "id": null, "result": {}}),
    };
    // Copied to its exact length: a formatted string's spare capacity would
    // count as the guard's.
    bytes::Bytes::copy_from_slice(format!("data: {data}\n\n").as_bytes())
}
