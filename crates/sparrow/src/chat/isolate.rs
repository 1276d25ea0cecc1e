//! Running one piece of work (a chat template's compile or render) on a thread whose heap
//! growth is capped ([`super::heap_cap`]), so that passing the cap is an error for the
//! caller rather than an abort or the kernel's OOM killer for the process.
//!
//! The threads are kept between renders (a pool of idle workers): starting a thread per
//! render measured 36 µs against a 1.7 µs render of a one-message chat, and +12% on a
//! 5,000-message one (a new thread's malloc arena is cold); handing the work to a waiting
//! worker costs two wake-ups (docs/reliability.md has the figures). A worker stopped at
//! its cap is never returned to the pool.

use super::heap_cap::{self, Ending, Signal};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex};

/// Stack of a worker: minijinja recurses per nested loop, condition and macro call, up to
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

/// One piece of work for a worker: the cap, where to report, and the work (which puts its
/// result where its caller will look).
struct Task {
    cap: usize,
    signal: Arc<Signal>,
    work: Box<dyn FnOnce() + Send>,
}

/// A worker thread's inbox.
struct Worker {
    inbox: Mutex<Option<Task>>,
    arrived: Condvar,
}

/// Workers waiting for work.
static IDLE: Mutex<Vec<Arc<Worker>>> = Mutex::new(Vec::new());

impl Worker {
    /// Start a worker thread.
    fn spawn() -> Result<Arc<Worker>, Stopped> {
        let worker = Arc::new(Worker {
            inbox: Mutex::new(None),
            arrived: Condvar::new(),
        });
        let me = Arc::clone(&worker);
        std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(STACK_BYTES)
            .spawn(move || me.serve())
            .map_err(Stopped::NoThread)?;
        Ok(worker)
    }

    /// The worker's loop: each task runs armed with its cap. Past the cap the thread
    /// sleeps inside an allocation for ever, so the signal, held by the task, outlives
    /// its arming.
    fn serve(&self) {
        loop {
            let task = {
                let inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
                let mut inbox = self
                    .arrived
                    .wait_while(inbox, |t| t.is_none())
                    .unwrap_or_else(|p| p.into_inner());
                inbox.take().expect("woken with a task")
            };
            let Task { cap, signal, work } = task;
            // SAFETY: `signal` lives until after `disarm` below (or for ever, past the cap).
            unsafe { heap_cap::arm(cap, Arc::as_ptr(&signal)) };
            let _ = std::panic::catch_unwind(AssertUnwindSafe(work));
            heap_cap::disarm();
            signal.set(Ending::Finished);
        }
    }

    fn give(&self, task: Task) {
        *self.inbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        self.arrived.notify_one();
    }
}

/// Run `work` on a worker thread whose net heap growth may not pass `cap` bytes, and wait
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
    let idle = IDLE.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let worker = match idle {
        Some(w) => w,
        None => Worker::spawn()?,
    };
    let signal = Arc::new(Signal::new());
    let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let out = Arc::clone(&slot);
    worker.give(Task {
        cap,
        signal: Arc::clone(&signal),
        work: Box::new(move || {
            let value = work();
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
        }),
    });
    if signal.wait() == Ending::OverCap {
        return Err(Stopped::OverCap);
    }
    IDLE.lock().unwrap_or_else(|p| p.into_inner()).push(worker);
    let value = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    value.ok_or(Stopped::Panicked)
}
