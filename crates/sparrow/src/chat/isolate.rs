//! Running one piece of work (a chat template's render) on a thread of its own whose heap
//! growth is capped ([`super::heap_cap`]), so that passing the cap is an error for the
//! caller rather than an abort or the kernel's OOM killer for the process.

use super::heap_cap::{self, Ending, Signal};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

/// Stack of the worker: minijinja recurses per nested loop, condition and macro call, up to
/// the template's depth limit (100); 8 MiB, as a main thread gets (reserved, not touched).
const STACK_BYTES: usize = 8 << 20;

/// Why capped work returned no value.
#[derive(Debug)]
pub enum Stopped {
    /// It would have passed its cap; the worker is stopped for good, holding at most the cap.
    OverCap,
    /// It panicked.
    Panicked,
    /// No thread could be started for it.
    NoThread(std::io::Error),
}

/// Run `work` on a new thread whose net heap growth may not pass `cap` bytes, and wait
/// for it. Without [`heap_cap::TemplateAllocator`] there is no cap to keep: `work` runs
/// on the calling thread.
pub fn run_capped<T, F>(cap: usize, work: F) -> Result<T, Stopped>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if !heap_cap::installed() {
        return Ok(work());
    }
    let signal = Arc::new(Signal::new());
    let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let (worker_signal, worker_slot) = (Arc::clone(&signal), Arc::clone(&slot));
    std::thread::Builder::new()
        .name("chat-template".into())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            // SAFETY: `worker_signal` lives as long as this closure, which is as long as
            // the thread: past the cap the thread sleeps inside an allocation, for ever.
            unsafe { heap_cap::arm(cap, Arc::as_ptr(&worker_signal)) };
            let result = std::panic::catch_unwind(AssertUnwindSafe(work));
            heap_cap::disarm();
            if let Ok(value) = result {
                *worker_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
            }
            worker_signal.set(Ending::Finished);
        })
        .map_err(Stopped::NoThread)?;
    match signal.wait() {
        Ending::OverCap => Err(Stopped::OverCap),
        _ => slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(Stopped::Panicked),
    }
}
