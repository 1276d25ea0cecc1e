//! Running one piece of work (a chat template's compile or render) with its heap growth
//! capped ([`super::heap_cap`]), so that passing the cap is an error for the caller rather
//! than an abort or the kernel's OOM killer for the process.
//!
//! The work runs on the caller's own thread, in a coroutine with a stack of its own
//! (`corosensei`): when an allocation would pass the cap, the allocator switches back to the
//! caller, which abandons the coroutine — its stack and the heap it grew (at most the cap)
//! are never given back, and nothing of it runs again. A switch costs nanoseconds, where
//! handing the work to a worker thread cost two wake-ups (~7.5 µs against a 1.7 µs render
//! of a one-message chat; docs/reliability.md has the figures). Each thread keeps one
//! stack for its renders.

use super::heap_cap;
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};
use std::cell::RefCell;

/// Stack of a render: minijinja recurses per nested loop, condition and macro call, up to
/// the template's depth limit (100); 8 MiB, as a main thread gets (reserved, not touched).
const STACK_BYTES: usize = 8 << 20;

thread_local! {
    /// This thread's stack for capped work, kept between runs (mapping one costs more
    /// than a short render).
    static SPARE_STACK: RefCell<Option<DefaultStack>> = const { RefCell::new(None) };
}

/// Why capped work returned no value.
#[derive(Debug)]
pub enum Stopped {
    /// It would have passed its cap; it was abandoned, holding at most the cap.
    OverCap,
    /// It panicked.
    Panicked,
    /// No stack could be mapped for it.
    NoStack(std::io::Error),
}

/// Run `work` on this thread with its net heap growth capped at `cap` bytes. Without
/// [`heap_cap::TemplateAllocator`] there is no cap to keep: `work` simply runs.
pub fn run_capped<T, F>(cap: usize, work: F) -> Result<T, Stopped>
where
    T: 'static,
    F: FnOnce() -> T + 'static,
{
    if !heap_cap::installed() {
        return Ok(work());
    }
    let stack = match SPARE_STACK.with(|s| s.borrow_mut().take()) {
        Some(stack) => stack,
        None => DefaultStack::new(STACK_BYTES).map_err(Stopped::NoStack)?,
    };
    let mut coroutine = Coroutine::with_stack(stack, move |yielder, ()| {
        heap_cap::armed_while(cap, yielder, work)
    });
    match coroutine.resume(()) {
        CoroutineResult::Return(value) => {
            let stack = coroutine.into_stack();
            SPARE_STACK.with(|s| *s.borrow_mut() = Some(stack));
            value.ok_or(Stopped::Panicked)
        }
        CoroutineResult::Yield(()) => {
            // Stopped inside an allocation past the cap. Unwinding its stack would run
            // the render's code again; leaving it keeps what it holds for good.
            std::mem::forget(coroutine);
            Err(Stopped::OverCap)
        }
    }
}
